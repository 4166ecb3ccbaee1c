"""The local executor's claim on a run (executor.json, created only where none is): two executors sharing a
runs directory, such as two `reproduce run` commands on one node with different --gpus, never train the
same run; a claim left by an executor that is gone is taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from nvfp4train.reproduce import executors
from nvfp4train.reproduce.experiments import load_experiment
from nvfp4train.reproduce.plan import plan_experiment, run_state
from tests.reproduce.test_cli import TINY


def one_run(tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY)
    (run,) = plan_experiment(load_experiment("tiny", experiments), tmp_path / "runs", ["bf16"], [1], "cpu")
    run.out_dir.mkdir(parents=True)
    return run


def test_a_run_held_by_a_live_executor_is_left_to_it_and_a_stale_claim_is_taken_over(tmp_path):
    run = one_run(tmp_path)
    marker = run.out_dir / "executor.json"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        marker.write_text(json.dumps({"pid": holder.pid, "host": os.uname().nodename, "started": 0}))
        assert run_state(run.out_dir) == "running"
        lines: list[str] = []
        assert executors.RunProcess(run, "abc1234", None, log=lines.append).execute() == "running"
        assert lines == ["tiny/bf16/seed1: running in another executor; left to it"]
        assert not (run.out_dir / "console.log").exists() and not (run.out_dir / "run.json").exists()
        assert json.loads(marker.read_text())["pid"] == holder.pid  # the holder's claim is untouched
    finally:
        holder.kill()
        holder.wait()
    assert run_state(run.out_dir) == "pending"  # its executor is gone
    assert executors.RunProcess(run, "abc1234", None).claim()
    assert json.loads(marker.read_text())["pid"] == os.getpid()
    assert not executors.RunProcess(run, "abc1234", None).claim()  # held now by this (live) process


def test_a_run_finished_by_another_executor_is_not_trained_again(tmp_path):
    run = one_run(tmp_path)
    (run.out_dir / "run.json").write_text(json.dumps({"state": "done", "attempts": 1, "train_rc": 0}))
    lines: list[str] = []
    assert executors.RunProcess(run, "abc1234", None, log=lines.append).execute() == "done"
    assert lines == ["tiny/bf16/seed1: done by another executor"]
    assert not (run.out_dir / "console.log").exists() and not (run.out_dir / "executor.json").exists()
    assert json.loads((run.out_dir / "run.json").read_text())["attempts"] == 1
