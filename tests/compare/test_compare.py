"""`python -m nvfp4train.compare`: figures, markdown and JSON from real runs; gaps recomputed by hand from
metrics.jsonl; seeds, short runs, mismatches, bad input; the W&B run written offline."""

import importlib.util
import json
import shutil
import struct
import subprocess
import sys
import time

import pytest
import yaml

from nvfp4train.compare.__main__ import main
from tests.conftest import REPO, cli_env, read_metrics

PNG = b"\x89PNG\r\n\x1a\n"


def final_loss(run_dir):
    return [r for r in read_metrics(run_dir) if "loss" in r][-1]["loss"]


def test_compare_writes_figures_markdown_and_json(runs, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.compare",
            str(runs["base_s1"]),
            str(runs["base_s2"]),
            str(runs["arm"]),
            "--baseline",
            str(runs["base_s1"]),
            "--out",
            str(out),
            "--smooth",
            "0",
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("loss.png", "relative_loss.png", "stability.png"):
        assert (out / name).read_bytes()[:8] == PNG
    result = json.loads((out / "compare.json").read_text())
    base, arm = result["arms"]
    assert base["label"] == "optim.lr=0.003" and base["seeds"] == 2 and arm["label"] == "optim.lr=0.001"
    # 8 steps x 128 tokens: phases at 70% / 90%, the WSD decay over the last 2 steps, the end.
    assert [(m["label"], m["tokens"]) for m in result["markers"]] == [
        ("data phase 1", pytest.approx(716.8)),
        ("LR decay", 768),
        ("data phase 2", pytest.approx(921.6)),
        ("end of run", 1024),
    ]
    # Without smoothing the end-of-run gap is plain arithmetic on the three final losses.
    b1, b2, a = final_loss(runs["base_s1"]), final_loss(runs["base_s2"]), final_loss(runs["arm"])
    end = next(g for g in result["gaps"] if g["milestone"] == "end of run")
    mean = (b1 + b2) / 2
    assert end["gap_pct"] == pytest.approx((a - mean) / mean * 100, rel=1e-6)
    assert end["baseline_spread_pct"] == pytest.approx(abs(b1 - b2) / mean * 100, rel=1e-6)
    assert end["arm_spread_pct"] is None
    assert end["exceeds_baseline_spread"] == (abs(end["gap_pct"]) > end["baseline_spread_pct"])
    # Every gap number in the markdown comes from the JSON.
    md = (out / "compare.md").read_text()
    for g in result["gaps"]:
        assert f"{g['gap_pct']:+.3f}" in md and f"{g['baseline_spread_pct']:.3f}" in md
    # peak memory and checkpoint time come from the runs' records (peak RSS on CPU); the markdown shows them
    for runs in result["stability"].values():
        for r in runs:
            assert r["peak_mem_gib"] > 0 and f"{r['peak_mem_gib']:.2f}" in md
            assert r["checkpoint_time_s"] is None or f"{r['checkpoint_time_s']:.2f}" in md
    held = result["heldout"]["optim.lr=0.001"]
    assert held["tokens"] == 1024 and set(held["relative_pct"]) == {"literature", "encyclopedic", "code", "mean"}
    stab = result["stability"]["optim.lr=0.003"]
    assert [s["last_step"] for s in stab] == [8, 8] and all(s["tokens_per_s"] > 0 for s in stab)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["arms"] == ["optim.lr=0.003", "optim.lr=0.001"]


def test_short_runs_missing_steps_recorded_extras_and_eval_table(runs, tmp_path):
    short = tmp_path / "short"
    shutil.copytree(runs["base_s2"], short, ignore=shutil.ignore_patterns("checkpoints"))
    records = read_metrics(short)
    kept = [r for r in records if r["step"] <= 5 and r["step"] != 3]  # stopped at 5, step 3 lost
    kept[-1].update(peak_mem_gib=1.5, checkpoint_time_s=0.25)
    kept[1].update(loss=float("nan"), step_skipped=True, skipped_steps=1)  # a skipped non-finite step
    kept[2].update(loss_spike=True, loss_spikes=1)
    (short / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    arm = tmp_path / "arm"
    shutil.copytree(runs["arm"], arm, ignore=shutil.ignore_patterns("checkpoints"))
    (arm / "eval.json").write_text(
        json.dumps(
            {
                "tasks": {"t": {"primary": "acc", "acc": 0.75}},
                "heldout": {"code": {"loss": 5.0}},
                "heldout_tp": {"code": {"loss": 5.25}},  # eval_precision=both
                "heldout_sequences": 64,
            }
        )
    )
    out = tmp_path / "out"
    assert main([str(runs["base_s1"]), str(short), str(arm), "--out", str(out), "--no-plots"]) == 0
    result = json.loads((out / "compare.json").read_text())
    curve = result["curves"]["optim.lr=0.003"]
    assert curve["train_tokens"][-1] == 1024  # the longer seed carries the curve to the end
    s2 = next(s for s in result["stability"]["optim.lr=0.003"] if s["source"] == str(short))
    assert s2["last_step"] == 5 and s2["peak_mem_gib"] == 1.5 and s2["checkpoint_time_s"] == 0.25
    assert s2["skipped_steps"] == 1 and s2["loss_spikes"] == 1
    assert [e[2] for e in curve["events"]["short"]] == ["skipped", "spike"]
    assert all(v is not None for v in curve["train_loss_mean"])  # the NaN of the skipped step stays out
    assert result["eval"] == {
        "t (acc)": {"optim.lr=0.001": {"mean": 0.75, "seeds": 1}},
        "held-out code (loss; BF16 evaluation, 64 sequences)": {"optim.lr=0.001": {"mean": 5.0, "seeds": 1}},
        "held-out code (loss; training-precision evaluation, 64 sequences)": {
            "optim.lr=0.001": {"mean": 5.25, "seeds": 1}
        },
    }
    assert "| t (acc) | — | 0.7500 |" in (out / "compare.md").read_text()


def one_line_error(capsys, *args):
    assert main(list(args)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_mismatched_and_bad_runs_are_refused_with_nothing_written(runs, tmp_path, capsys, monkeypatch):
    other = tmp_path / "other_data"
    shutil.copytree(runs["arm"], other, ignore=shutil.ignore_patterns("checkpoints"))
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["data"]["phases"][1]["start"] = 0.5
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert "differ in data.phases" in one_line_error(capsys, str(runs["base_s1"]), str(other), "--out", str(out))
    longer = tmp_path / "longer"
    shutil.copytree(runs["arm"], longer, ignore=shutil.ignore_patterns("checkpoints"))
    config = yaml.safe_load((longer / "config.yaml").read_text())
    config["train"]["max_steps"] = 16
    (longer / "config.yaml").write_text(yaml.safe_dump(config))
    assert "token budget" in one_line_error(capsys, str(runs["base_s1"]), str(longer), "--out", str(out))
    empty = tmp_path / "no_metrics"
    shutil.copytree(runs["arm"], empty, ignore=shutil.ignore_patterns("checkpoints", "metrics.jsonl"))
    assert "metrics.jsonl not found" in one_line_error(capsys, str(runs["base_s1"]), str(empty), "--out", str(out))
    assert "not the out_dir of a training run" in one_line_error(capsys, str(tmp_path), "--out", str(out))
    assert "wandb:ENTITY/PROJECT/RUN_ID" in one_line_error(capsys, "wandb:just-a-name", "--out", str(out))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc either
    if importlib.util.find_spec("wandb") is not None:  # without the package the extra is named first (below)
        assert "needs an API key" in one_line_error(
            capsys, str(runs["base_s1"]), "wandb:me/proj/abc123", "--out", str(out)
        )
    assert "--group-by colour" in one_line_error(
        capsys, str(runs["base_s1"]), "--group-by", "colour", "--out", str(out)
    )
    assert not out.exists()
    assert main([str(runs["base_s1"]), str(other), "--out", str(out), "--allow-mismatch", "--no-plots"]) == 0


def read_wandb_file(path):
    """Records of a W&B transaction log (.wandb: LevelDB-style 32 KiB blocks of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, records, partial = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        partial += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST fragment
            record = wandb_internal_pb2.Record()
            record.ParseFromString(partial)
            records.append(record)
            partial = b""
    return records


def test_wandb_offline_run_holds_the_comparison(runs, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    assert (
        main(
            [
                str(runs["base_s1"]),
                str(runs["arm"]),
                "--out",
                str(out),
                "--no-plots",
                "--wandb",
                "--wandb-mode",
                "offline",
            ]
        )
        == 0
    )
    result = json.loads((out / "compare.json").read_text())
    files = list(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1
    # The W&B service may still be writing when finish() returns: wait for the run's exit record.
    for _ in range(60):
        records = read_wandb_file(files[0])
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.5)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_group == "cmp_test" and run.job_type == "compare"
    history = [
        {(i.key or ".".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    key = "relative_loss_pct/optim.lr=0.001"
    rel = {h["tokens"]: h[key] for h in history if key in h}
    curve = result["curves"]["optim.lr=0.001"]
    assert rel == pytest.approx(dict(zip(curve["relative_tokens"], curve["relative_pct_mean"])))
    tables = list(files[0].parent.glob("files/media/table/gaps_*.table.json"))
    assert len(tables) == 1 and any(h.get("gaps._type") == "table-file" for h in history)
    table = json.loads(tables[0].read_text())
    assert [row[5] for row in table["data"]] == pytest.approx([g["gap_pct"] for g in result["gaps"]])


def test_command_line_writes_the_comparison(runs, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.compare",
            str(runs["base_s1"]),
            str(runs["arm"]),
            "--out",
            str(out),
            "--no-plots",
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "compare.json").is_file() and (out / "compare.md").is_file()


def test_wandb_without_the_extra_names_it(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as it does without the package
    out = tmp_path / "out"
    for argv in (["wandb:me/proj/abc123"], [str(runs["base_s1"]), str(runs["arm"]), "--wandb"]):
        line = one_line_error(capsys, *argv, "--out", str(out))
        assert "needs the wandb package: pip install 'nvfp4train[wandb]'" in line, line
    assert not out.exists()


def test_an_old_record_and_a_run_of_today_form_one_arm(tmp_path):
    """A committed record (docs/results/runs, the precision keys of its day) and a run written today with the
    same recipe (bf16_first / bf16_last) differ only in seed: one arm, not two."""
    from nvfp4train.compare.runs import group_runs, load_local

    record = REPO / "docs" / "results" / "runs" / "fp8_vs_nvfp4" / "nvfp4" / "seed1"
    today = tmp_path / "seed9"
    shutil.copytree(record, today)
    config = yaml.safe_load((today / "config.yaml").read_text())
    precision = config["precision"]
    for side in ("first", "last"):
        count, fraction = precision.pop(f"bf16_{side}_blocks"), precision.pop(f"bf16_{side}_fraction")
        precision[f"bf16_{side}"] = fraction or count
    config["seed"] = 9
    (today / "config.yaml").write_text(yaml.safe_dump(config))
    arms = group_runs([load_local(record), load_local(today)], None)
    assert len(arms) == 1 and len(arms[0].runs) == 2
