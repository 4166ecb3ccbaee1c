"""What a run shows: a short banner on the terminal, the full log in out_dir/train.log (the backend choice
once), and the mid-run precision switch recorded in metrics.jsonl so comparisons can mark it."""
from tests.conftest import read_metrics, run_train


def test_short_banner_full_log_and_switch_in_metrics(tmp_path):
    out = tmp_path / "run"
    proc = run_train(f"out_dir={out}", "precision=nvfp4", "precision.switch.at_fraction=0.5", "train.max_steps=4",
                     "train.log_every=10", "train.progress=false", "train.seq_len=32", "train.global_batch_size=2",
                     "train.eval_sequences=1")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("model hybrid_tiny:") and lines[-1].startswith("done: step 4")
    assert len(lines) == 3 and lines[1].startswith("step 3: precision: switched full to BF16"), lines
    assert "backend" not in proc.stdout.replace("(emulated)", "") and proc.stderr == "", proc.stderr
    log = (out / "train.log").read_text()
    assert log.count("backend emulated (") == 1 and "model hybrid_tiny:" in log
    switched = [r for r in read_metrics(out) if "precision_switch" in r]
    assert [r["step"] for r in switched] == [3] and "loss" in switched[0]
