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
from nvfp4train.train.rundir import RunDirLock
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


def test_a_failed_attempt_is_not_moved_aside_while_a_trainer_holds_its_run_directory(tmp_path):
    """Retrying a run that failed before its first checkpoint moves its files aside only under the run
    directory's lock: a trainer holding out_dir (one started by hand, say) refuses it in one line, and
    nothing moves."""
    run = one_run(tmp_path)
    (run.out_dir / "run.json").write_text(json.dumps({"state": "failed", "attempts": 1, "train_rc": 1}))
    (run.out_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    lines: list[str] = []
    with RunDirLock(run.out_dir):
        assert executors.RunProcess(run, "abc1234", None, log=lines.append).execute() == "failed"
    assert len(lines) == 1 and lines[0].startswith("tiny/bf16/seed1: not started: out_dir=")
    assert "is in use by another run (pid " in lines[0], lines
    assert (run.out_dir / "metrics.jsonl").read_text() == '{"step": 1, "loss": 9.0}\n'
    assert json.loads((run.out_dir / "run.json").read_text())["attempts"] == 1
    assert sorted(p.name for p in run.out_dir.parent.iterdir()) == ["seed1"]
    assert not (run.out_dir / "executor.json").exists() and not (run.out_dir / "console.log").exists()


def test_run_json_records_the_corpus_the_run_read(tmp_path, monkeypatch):
    """run.json's `corpus`: each data file the run's saved config reads, by the first 16 hex digits of its
    sha256 (training splits of the blend, every held-out split); null where the trainer wrote no config."""
    import yaml

    from nvfp4train.data.paths import REPO_ROOT
    from nvfp4train.data.shards import sha256_file

    run = one_run(tmp_path)
    bundled = yaml.safe_load((REPO_ROOT / "configs" / "data" / "bundled.yaml").read_text())

    def train_then_eval(self, command, console):  # what the trainer leaves behind, without training
        if "nvfp4train.train" in command:
            (run.out_dir / "config.yaml").write_text(yaml.safe_dump({"seed": 1, "data": bundled}))
            run.final_checkpoint().mkdir(parents=True)
        return 0

    monkeypatch.setattr(executors.RunProcess, "_call", train_then_eval)
    assert executors.RunProcess(run, "abc1234", None).execute() == "done"
    corpus = json.loads((run.out_dir / "run.json").read_text())["corpus"]
    expected = {
        f"{name}/{split}": sha256_file(REPO_ROOT / bundled["sources"][name][split])[:16]
        for name in ("literature", "encyclopedic", "code")
        for split in ("train", "val")
    }
    assert corpus == expected

    (tmp_path / "other").mkdir()
    other = one_run(tmp_path / "other")
    monkeypatch.setattr(executors.RunProcess, "_call", lambda self, command, console: 1)  # failed at start
    assert executors.RunProcess(other, "abc1234", None).execute() == "failed"
    assert json.loads((other.out_dir / "run.json").read_text())["corpus"] is None
