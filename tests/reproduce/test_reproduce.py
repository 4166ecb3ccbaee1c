"""The reproduction runner end to end on CPU: launch (detached workers) -> poll -> collect -> ingest ->
skip-existing -> report, with a tiny experiment of 2 arms x 1 seed; and its one-line refusals."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tests.conftest import REPO, cli_env

TINY_EXPERIMENT = """
description: two arms of the tiny CPU model
tokens: 1536                      # 6 steps x 4 x 64
seeds: [1]
baseline: bf16
base: [model=hybrid_tiny, data=bundled, train.seq_len=64, train.global_batch_size=4, train.log_every=1,
       train.eval_every=3, train.eval_sequences=2, optim.schedule.warmup_steps=1]
arms:
  bf16: [precision=bf16]
  nvfp4: [precision=nvfp4]
eval: [tasks=arithmetic, max_items=4, heldout_sequences=2, batch_size=2]
"""


def reproduce(*args, experiments: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    prefix = ["--experiments-dir", str(experiments)] if experiments else []
    return subprocess.run([sys.executable, "-m", "nvfp4train.reproduce", *prefix, *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_launch_poll_collect_ingest_report(tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY_EXPERIMENT)
    runs, out, results = tmp_path / "runs", tmp_path / "out", tmp_path / "results"
    launch = ["launch", "tiny", "--device", "cpu", "--per-gpu", "2", "--runs-dir", str(runs), "--data", "",
              "--skip-existing", str(results / "runs"), "--commit", "abc123"]

    t0 = time.monotonic()
    proc = reproduce(*launch, experiments=experiments)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 60, "launch must return without waiting for the runs"
    assert "tiny/bf16/seed1" in proc.stdout and "tiny/nvfp4/seed1" in proc.stdout
    assert "tokens/param" in proc.stdout and "started 2 run(s) in 2 worker(s)" in proc.stdout

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        polled = reproduce("poll", "--runs-dir", str(runs))
        assert polled.returncode == 0, polled.stderr
        if "2 done" in polled.stdout or "failed" in polled.stdout or "lost" in polled.stdout:
            break
        time.sleep(2)
    assert "2 done" in polled.stdout, polled.stdout + "".join(
        p.read_text()[-2000:] for p in runs.glob("*/*/seed1/console.log"))
    assert "6/6" in polled.stdout

    collected = reproduce("collect", "--runs-dir", str(runs), "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    archives = list(out.iterdir())
    assert len(archives) == 1 and archives[0].name.endswith(".tar.gz")
    with tarfile.open(archives[0]) as tar:
        names = sorted(tar.getnames())
    for arm in ("bf16", "nvfp4"):
        for f in ("metrics.jsonl", "config.yaml", "eval.json", "run.json"):
            assert f"tiny/{arm}/seed1/{f}" in names
    assert not any("checkpoint" in n for n in names)

    ingested = reproduce("ingest", str(archives[0]), "--into", str(results / "runs"))
    assert ingested.returncode == 0, ingested.stderr
    run_dir = results / "runs" / "tiny" / "nvfp4" / "seed1"
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "eval.json", "metrics.jsonl", "run.json"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["commit"] == "abc123" and info["gpu"] == "cpu" and info["train_rc"] == 0 and info["eval_rc"] == 0
    assert info["torch"] and info["wall_s"] > 0
    again = reproduce("ingest", str(archives[0]), "--into", str(results / "runs"))
    assert "skip tiny/bf16/seed1" in again.stdout and "0 run(s) added" in again.stdout

    relaunch = reproduce(*launch, experiments=experiments)
    assert relaunch.returncode == 0, relaunch.stderr
    assert "skip tiny/bf16/seed1: already in" in relaunch.stdout and "nothing to start" in relaunch.stdout
    other_budget = reproduce(*launch, "--tokens", "3072", "--arms", "bf16", "--seeds", "2", experiments=experiments)
    assert other_budget.returncode == 2 and len(other_budget.stderr.strip().splitlines()) == 1
    assert "--tokens 1536" in other_budget.stderr

    reported = reproduce("report", "--runs", str(results / "runs"), "--out", str(results), "--no-plots",
                         experiments=experiments)
    assert reported.returncode == 0, reported.stderr
    text = (results / "reproduction.md").read_text()
    assert "## tiny" in text and "nvfp4 vs bf16" in text and "not run" not in text.split("## tiny")[1].split("##")[0]
    assert (results / "tiny" / "compare.json").is_file()


def test_bad_input_is_one_line(tmp_path):
    for args, needle in [(["launch", "no_such_experiment", "--device", "cpu"], "no_such_experiment"),
                         (["launch", "fp8_vs_nvfp4", "--arms", "fp4_typo", "--device", "cpu"], "fp4_typo"),
                         (["ingest", str(tmp_path / "missing.tar.gz")], "missing.tar.gz"),
                         (["collect", "--runs-dir", str(tmp_path)], "--out")]:
        proc = reproduce(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_plan_of_the_paper_experiments_fits_the_budget():
    """Every arm of configs/reproduce composes; --budget-minutes scales the shared token budget so the
    busiest GPU ends in time, keeping the 1.36x arm at 1.36x (a dry run: nothing starts, no data needed)."""
    proc = reproduce("launch", "all", "--gpus", "8", "--budget-minutes", "20", "--dry-run", "--data", "",
                     "--runs-dir", "/nonexistent/runs")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if "/seed" in line.split()[0]}
    assert len(rows) == 3 * 3 + 5 + 2 + 2
    steps = {key: int(row[4]) for key, row in rows.items()}
    assert len({v for k, v in steps.items() if "1.36x" not in k}) == 1
    base = steps["fp8_vs_nvfp4/nvfp4/seed1"]
    assert steps["mxfp4/mxfp4_1.36x/seed1"] == round(base * 1.36)
    wall = float(proc.stdout.split("estimated wall time: ")[1].split()[0])
    assert 15 < wall <= 20.0
    assert "hybrid_repro 30.89M params (22.50M without embedding" in proc.stdout
    assert "dry run: nothing started" in proc.stdout
