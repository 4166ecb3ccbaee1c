"""`reproduce run --runs-per-process N`: the local executor trains a slot's runs one after the other in one
worker process (train/worker.py) instead of a process each: the same metrics and evaluations bit for bit as
runs of their own processes, each run's output in its console.log, a refusal one run's failure only, and a
bad request to the worker one answer naming what is wrong."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

from tests.conftest import REPO, cli_env
from tests.reproduce.test_cli import TINY, reproduce, wait_for_steps

TIMING = ("time", "tok", "_s", "mfu", "seconds", "wall", "cpu", "load", "mem", "threads")


def _quick(tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    quick = TINY.replace("tokens: 25600", "tokens: 1536").replace("train.save_every=25", "train.save_every=3")
    (experiments / "tiny.yaml").write_text(quick.replace("eval_points: 4", "eval_points: 2"))  # 6 steps a run
    return experiments


def _numbers(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]
    evaluation = json.loads((run_dir / "eval.json").read_text())
    return rows, {k: v for k, v in evaluation.items() if k not in ("seconds", "run_dir", "checkpoint")}


def test_runs_in_one_worker_process_equal_runs_in_processes_of_their_own(tmp_path):
    experiments = _quick(tmp_path)
    separate, together = tmp_path / "separate", tmp_path / "together"
    command = ["run", "tiny", "--executor", "local", "--device", "cpu"]
    one = reproduce(*command, "--runs-dir", str(separate), experiments=experiments)
    assert one.returncode == 0, one.stdout + one.stderr
    many = reproduce(*command, "--runs-dir", str(together), "--runs-per-process", "3", experiments=experiments)
    assert many.returncode == 0, many.stdout + many.stderr
    assert "4 of 4 run(s) done" in many.stdout and "Traceback" not in many.stdout + many.stderr
    for key in ("tiny/bf16/seed1", "tiny/nvfp4/seed1", "tiny/bf16/seed2", "tiny/nvfp4/seed2"):
        a, b = separate / key, together / key
        assert _numbers(a) == _numbers(b), key
        info = json.loads((b / "run.json").read_text())
        assert info["state"] == "done" and info["eval_in_training"] and info["train_rc"] == 0
        assert info["trained_in_worker"] and not json.loads((a / "run.json").read_text())["trained_in_worker"]
        console = (b / "console.log").read_text()
        assert "(in a worker process)" in console and f"out_dir={b}" in console
        assert re.search(r"^done: step 6", console, re.M), console  # the run's own output, in its own log
        assert "(in a worker process)" not in (a / "console.log").read_text()


def test_a_refused_run_fails_alone_and_the_worker_trains_the_next(tmp_path):
    """nvfp4 seed 1 holds a checkpoint the trainer refuses to resume from (one line, exit 2): that run fails,
    and the same worker trains the three others."""
    experiments = _quick(tmp_path)
    runs = tmp_path / "runs"
    damaged = runs / "tiny" / "nvfp4" / "seed1" / "checkpoints" / "step_00000003"
    damaged.mkdir(parents=True)
    (damaged / "meta.json").write_text("{}")
    command = ["run", "tiny", "--executor", "local", "--device", "cpu", "--runs-dir", str(runs)]
    proc = reproduce(*command, "--runs-per-process", "4", experiments=experiments)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "3 of 4 run(s) done" in proc.stdout and "not done: tiny/nvfp4/seed1" in proc.stdout, proc.stdout
    refused = json.loads((damaged.parents[1] / "run.json").read_text())
    assert refused["state"] == "failed" and refused["train_rc"] == 2
    console = (damaged.parents[1] / "console.log").read_text()
    assert "step_00000003" in console and "Traceback" not in console, console
    for key in ("tiny/bf16/seed1", "tiny/bf16/seed2", "tiny/nvfp4/seed2"):
        assert json.loads((runs / key / "run.json").read_text())["state"] == "done", key


def test_a_bad_request_is_one_answer_naming_what_is_wrong(tmp_path):
    requests = "\n".join(["not json", '{"args": "x", "console": "c"}', '{"args": []}', ""]) + "\n"
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train.worker"],
        input=requests,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["rc"] for a in answers] == [2, 2, 2]
    assert "not JSON" in answers[0]["error"] and '"args" is a list of strings' in answers[1]["error"]
    assert 'exactly the keys "args" and "console"' in answers[2]["error"]


def test_runs_per_process_must_be_a_positive_whole_number(tmp_path):
    proc = reproduce("run", "tiny", "--runs-per-process", "0", "--dry-run")
    assert proc.returncode == 2 and "--runs-per-process" in proc.stderr and "1 or more" in proc.stderr


def test_a_stop_signal_checkpoints_the_run_in_the_worker_and_the_same_command_resumes_it(tmp_path, spawn):
    """SIGINT to the executor while the worker trains its second run: that run checkpoints and stops (the
    worker with it), nothing further starts, and the same command resumes it and trains the rest."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY)
    runs = tmp_path / "runs"
    command = [
        "run",
        "tiny",
        "--executor",
        "local",
        "--device",
        "cpu",
        "--runs-dir",
        str(runs),
        "--runs-per-process",
        "4",
    ]
    first = spawn(
        [sys.executable, "-m", "nvfp4train.reproduce", "--experiments-dir", str(experiments), *command],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    victim = runs / "tiny" / "nvfp4" / "seed1"  # the second run of the queue: the worker is warm
    wait_for_steps(first, victim, 5)
    first.send_signal(signal.SIGINT)
    out = first.communicate(timeout=300)[0]
    assert first.returncode == 1 and "1 of 4 run(s) done" in out, out
    info = json.loads((victim / "run.json").read_text())
    assert info["state"] == "interrupted" and info["trained_in_worker"], info
    assert list((victim / "checkpoints").glob("step_*")) and not (runs / "tiny" / "bf16" / "seed2").exists()

    second = reproduce(*command, experiments=experiments)
    assert second.returncode == 0 and "3 of 3 run(s) done" in second.stdout, second.stdout + second.stderr
    assert json.loads((victim / "run.json").read_text())["attempts"] == 2
