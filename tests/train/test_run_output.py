"""What a run shows: a short banner on the terminal, the full log in out_dir/train.log (the backend choice
once), and the mid-run precision switch recorded in metrics.jsonl so comparisons can mark it."""

import re

import pytest

from tests.conftest import read_metrics, run_train


def test_short_banner_full_log_and_switch_in_metrics(tmp_path):
    out = tmp_path / "run"
    proc = run_train(
        f"out_dir={out}",
        "precision=nvfp4",
        "precision.switch.at_fraction=0.5",
        "train.max_steps=4",
        "train.log_every=10",
        "train.progress=false",
        "train.seq_len=32",
        "train.global_batch_size=2",
        "train.eval_sequences=1",
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("model hybrid_tiny:") and lines[-1].startswith("done: step 4")
    assert len(lines) == 5 and lines[1].startswith("step 3: precision: switched full to BF16"), lines
    # the end-of-run evaluation says what it is doing, then its loss, on the terminal (not only in train.log)
    assert lines[2] == (
        "step 4: held-out evaluation (training precision, up to 1 sequences per source: literature, encyclopedic, "
        "code) ..."
    ), lines
    assert lines[3].startswith(
        "held-out loss at step 4 (in training, training precision, up to 1 sequences per source): "
    ), lines
    # what it measured, so that a slow machine says why
    assert re.search(
        r" \| [\d,]+ tok/s in \d+ s on (1 thread|[2-9]\d* threads), CPU time \d+ s \(\d+ s of it in the kernel\), "
        r"load average [\d.]+ \(this run included\)$",
        lines[4],
    ), lines
    assert "backend" not in proc.stdout.replace("(emulated)", "") and proc.stderr == "", proc.stderr
    log = (out / "train.log").read_text()
    assert log.count("backend emulated (") == 1 and "model hybrid_tiny:" in log
    switched = [r for r in read_metrics(out) if "precision_switch" in r]
    assert [r["step"] for r in switched] == [3] and "loss" in switched[0]


def test_wandb_summary_leads_with_the_loss(tmp_path):
    """The data/ and quant/ counters stay out of the W&B summary (they hid the loss), and W&B is silent."""
    pytest.importorskip("wandb")
    from tests.compare.test_compare import read_wandb_file

    out = tmp_path / "run"
    proc = run_train(
        f"out_dir={out}",
        "train.wandb.enabled=true",
        "train.wandb.mode=offline",
        "train.max_steps=2",
        "train.progress=false",
        "train.seq_len=32",
        "train.global_batch_size=2",
        "train.eval_sequences=1",
    )
    assert "wandb:" not in proc.stdout + proc.stderr
    (log,) = out.glob("wandb/offline-run-*/run-*.wandb")
    # but it says where the offline run is and how to upload it, as W&B's own banner would
    assert proc.stdout.splitlines()[-1] == f"W&B offline run in {log.parent}; upload it with: wandb sync {log.parent}"
    metrics = [r.metric for r in read_wandb_file(log) if r.WhichOneof("record_type") == "metric"]
    assert {m.glob_name for m in metrics if m.summary.none} == {"data/*", "quant/*"}


def test_deepspeed_start_up_lines_go_to_the_log_file(tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    proc = run_train(
        f"out_dir={out}",
        "train.parallel=deepspeed",
        "train.max_steps=1",
        "train.progress=false",
        "train.seq_len=32",
        "train.global_batch_size=2",
        "train.eval_sequences=1",
    )
    shown = [line.split(":")[0] for line in proc.stdout.splitlines() if not line.startswith(("held-out", "step 1:"))]
    assert shown == ["model hybrid_tiny", "done"], proc.stdout
    assert "DeepSpeed" not in proc.stderr and "deepspeed INFO" in (out / "train.log").read_text()
