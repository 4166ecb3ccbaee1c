"""benchmarks/bench_startup.py times a fresh and a warm start of the trainer and merges its rows into the JSON."""

from __future__ import annotations

import json
import sys

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env


def test_a_fresh_and_a_warm_start_give_a_row_each_and_a_rerun_replaces_them(tmp_path):
    out = tmp_path / "startup.json"
    out.write_text(json.dumps([{"model": "other", "trial": "warm", "run_s": 1.0}]))
    cmd = [sys.executable, "-m", "benchmarks.bench_startup", "--steps", "2", "--out", str(out), "--set",
           "model=hybrid_0p5m", "precision=bf16", "train.deterministic=false", "train.seq_len=64",
           "train.global_batch_size=2"]  # fmt: skip
    for _ in range(2):
        proc = run_and_kill_on_timeout(cmd, cwd=REPO, env=cli_env(), timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    ours = [r for r in rows if r["model"] == "hybrid_0p5m"]
    assert len(rows) == 3 and [r["trial"] for r in ours] == ["fresh", "warm"]
    for r in ours:
        assert r["precision"] == "bf16" and r["deterministic"] is False and (r["seq"], r["batch"]) == (64, 2)
        assert r["gpu"] == "cpu" and r["cprofile"] is False
        # the wait to the first step is the interpreter's and imports' part plus the trainer's own
        assert 0 < r["trainer_to_first_step_s"] < r["launch_to_first_step_s"] <= r["run_s"]
        assert abs(r["imports_s"] - (r["launch_to_first_step_s"] - r["trainer_to_first_step_s"])) < 0.15
    assert "launch→step1" in proc.stdout


def test_a_second_run_in_a_worker_process_gives_a_row_of_its_own(tmp_path):
    out = tmp_path / "startup.json"
    cmd = [sys.executable, "-m", "benchmarks.bench_startup", "--steps", "2", "--out", str(out), "--trials", "warm",
           "worker", "--set", "model=hybrid_0p5m", "precision=bf16", "train.deterministic=false", "train.seq_len=64",
           "train.global_batch_size=2"]  # fmt: skip
    proc = run_and_kill_on_timeout(cmd, cwd=REPO, env=cli_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {r["trial"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"warm", "worker"}
    worker = rows["worker"]
    assert 0 < worker["trainer_to_first_step_s"] < worker["launch_to_first_step_s"] <= worker["run_s"]
    # no interpreter, torch import or CUDA start for a run in a warm worker: less of the wait is before the trainer
    assert worker["imports_s"] < rows["warm"]["imports_s"], rows
