"""`python -m nvfp4train.reproduce` end to end on CPU: plan, run with the local executor (2 arms x 2 seeds
of hybrid_tiny, one run interrupted by SIGINT and resumed by running the same command again), status,
report; the SLURM array rendered by a dry run and executed by bash in its DRY_RUN mode; no verb that
carries archives; the report of the committed runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env

TINY = """
description: two arms of the tiny CPU model
tier: A
tokens: 25600                     # 100 steps x 4 x 64
seeds: [1, 2]
baseline: bf16
eval_points: 4
base: [model=hybrid_tiny, data=bundled, train.seq_len=64, train.global_batch_size=4, train.log_every=1,
       train.eval_sequences=2, train.eval_precision=bf16, train.save_every=25, optim.schedule.warmup_steps=1]
arms:
  bf16: [precision=bf16]
  nvfp4: [precision=nvfp4]
eval: [tasks=arithmetic, max_items=4, heldout_sequences=2, batch_size=2]
"""


def reproduce(*args, experiments: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    prefix = ["--experiments-dir", str(experiments)] if experiments else []
    return run_and_kill_on_timeout(
        [sys.executable, "-m", "nvfp4train.reproduce", *prefix, *args],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1),
        timeout=timeout,
    )


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, steps: int, timeout: float = 300) -> None:
    """Until the run in `run_dir` has logged `steps` training losses (while `proc`, its executor, runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line) >= steps:
            return
        assert proc.poll() is None, proc.communicate(timeout=60)[0]
        time.sleep(0.1)


@pytest.mark.slow  # 4 runs, a resume and their evaluations: minutes on 2 shared CPU cores
def test_plan_run_interrupt_resume_status_report(tmp_path, spawn):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY)
    runs = tmp_path / "runs"
    common = ["--runs-dir", str(runs)]

    planned = reproduce("plan", "tiny", "--device", "cpu", *common, experiments=experiments)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.count("python -m nvfp4train.train ") == 4
    assert planned.stdout.count("python -m nvfp4train.eval run_dir=") == 4
    assert "train.eval_every=25" in planned.stdout and "4 run(s)" in planned.stdout

    command = [
        sys.executable,
        "-m",
        "nvfp4train.reproduce",
        "--experiments-dir",
        str(experiments),
        "run",
        "tiny",
        "--executor",
        "local",
        "--device",
        "cpu",
        *common,
    ]
    first = spawn(
        command, cwd=REPO, env=cli_env(OMP_NUM_THREADS=1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    victim = runs / "tiny" / "bf16" / "seed1"
    wait_for_steps(first, victim, 5)  # interrupt the first run once it has trained a few steps
    first.send_signal(signal.SIGINT)
    out = first.communicate(timeout=300)[0]
    assert first.returncode == 1, out
    assert "received SIGINT" in out and "0 of 4 run(s) done" in out, out
    info = json.loads((victim / "run.json").read_text())
    assert info["state"] == "interrupted" and info["train_rc"] == 0 and info["eval_rc"] is None, info
    assert not (victim / "eval.json").exists()
    stopped_at = max(json.loads(line)["step"] for line in (victim / "metrics.jsonl").read_text().splitlines())
    assert stopped_at < 100 and list((victim / "checkpoints").glob("step_*")), stopped_at

    status = reproduce("status", "tiny", *common, experiments=experiments)
    assert status.returncode == 0 and "tiny/bf16/seed1" in status.stdout and "interrupted" in status.stdout

    second = reproduce("run", "tiny", "--executor", "local", "--device", "cpu", *common, experiments=experiments)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "tiny/bf16/seed1: interrupted before; resumes from its latest checkpoint" in second.stdout
    assert "4 of 4 run(s) done" in second.stdout
    console = (victim / "console.log").read_text()
    assert "resumed from" in console or f"step_{stopped_at:08d}" in console, console[-2000:]
    for arm in ("bf16", "nvfp4"):
        for seed in (1, 2):
            d = runs / "tiny" / arm / f"seed{seed}"
            info = json.loads((d / "run.json").read_text())
            assert info["state"] == "done" and info["train_rc"] == 0 and info["eval_rc"] == 0, info
            assert info["gpu"] == "cpu" and info["deterministic"] is False and info["wall_s"] > 0 and info["torch"]
            assert json.loads((d / "eval.json").read_text())["eval_precision"] == "bf16"
            # evaluated by the training process itself (train.final_eval): no second process started
            assert info["eval_in_training"] is True and "train.final_eval.enabled=true" in info["train_command"]
            assert "-m nvfp4train.eval " not in (d / "console.log").read_text()
            records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            assert max(r["step"] for r in records) == 100
            assert [r["step"] for r in records if "val/mean" in r] == [25, 50, 75, 100]
    assert json.loads((victim / "run.json").read_text())["attempts"] == 2
    # the eval command run.json records gives the in-training evaluation's eval.json, bit for bit
    done = runs / "tiny" / "nvfp4" / "seed2"
    in_training = json.loads((done / "eval.json").read_text())
    words = json.loads((done / "run.json").read_text())["eval_command"].split()
    again = subprocess.run([sys.executable, *words[1:]], cwd=REPO, env=cli_env(OMP_NUM_THREADS=1), capture_output=True)
    assert again.returncode == 0, again.stderr
    separate = json.loads((done / "eval.json").read_text())
    assert {k: v for k, v in separate.items() if k != "seconds"} == {
        k: v for k, v in in_training.items() if k != "seconds"
    }

    third = reproduce("run", "tiny", "--executor", "local", "--device", "cpu", *common, experiments=experiments)
    assert third.returncode == 0 and third.stdout.count(": done") == 4 and "nothing to run" in third.stdout

    out_dir = tmp_path / "results"
    reported = reproduce("report", "--runs-dir", str(runs), "--out", str(out_dir), experiments=experiments)
    assert reported.returncode == 0, reported.stderr
    text = (out_dir / "reproduction.md").read_text()
    assert text.startswith("# Reproduction")  # an experiment without claims of its own gets no claim rows
    assert (out_dir / "reproduction" / "tiny.png").is_file()


def test_run_queues_several_experiments_seed_by_seed(tmp_path):
    """`run A B`: one queue, seed by seed across both experiments (a campaign stopped part-way leaves whole
    seeds of each); --arms, which names one experiment's arms, is refused with two; slurm: an array each."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY)
    (experiments / "tiny_mx.yaml").write_text(TINY.replace("nvfp4: [precision=nvfp4]", "mxfp4: [precision=mxfp4]"))
    runs = ["--runs-dir", str(tmp_path / "runs")]
    local = ["--executor", "local", "--device", "cpu", "--dry-run", *runs]
    proc = reproduce("run", "tiny", "tiny_mx", *local, experiments=experiments)
    assert proc.returncode == 0, proc.stderr
    queued = re.findall(r"queued \d+: (\S+)", proc.stdout)
    assert queued == [
        "tiny/bf16/seed1",
        "tiny/nvfp4/seed1",
        "tiny_mx/bf16/seed1",
        "tiny_mx/mxfp4/seed1",
        "tiny/bf16/seed2",
        "tiny/nvfp4/seed2",
        "tiny_mx/bf16/seed2",
        "tiny_mx/mxfp4/seed2",
    ], proc.stdout
    assert not (tmp_path / "runs").exists()  # a dry run starts nothing

    refused = reproduce("run", "tiny", "tiny_mx", "--arms", "bf16", *local, experiments=experiments)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "error: --arms bf16: arms belong to one experiment, and 2 are named (tiny, tiny_mx): name one "
        "experiment, or leave --arms out to run every arm"
    ]
    twice = reproduce("run", "tiny", "tiny", *local, experiments=experiments)
    assert twice.returncode == 2 and "named twice" in twice.stderr

    slurm = reproduce("run", "tiny", "tiny_mx", "--executor", "slurm", "--dry-run", *runs, experiments=experiments)
    assert slurm.returncode == 0, slurm.stderr
    assert slurm.stdout.count("job array of 4 task(s)") == 2 and "not submitted" in slurm.stdout
    for name in ("tiny", "tiny_mx"):
        assert (tmp_path / "runs" / name / "slurm" / "array.sbatch").is_file()


def test_slurm_array_dry_run(tmp_path):
    runs = tmp_path / "runs"
    proc = reproduce(
        "run",
        "b_fp8_vs_nvfp4",
        "--executor",
        "slurm",
        "--dry-run",
        "--runs-dir",
        str(runs),
        "--sbatch",
        "partition=gpu",
    )
    assert proc.returncode == 0, proc.stderr
    assert "job array of 15 task(s)" in proc.stdout and "not submitted" in proc.stdout
    where = runs / "b_fp8_vs_nvfp4" / "slurm"
    text = (where / "array.sbatch").read_text()
    for needle in (
        "#SBATCH --array=0-14",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@180",
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus=1",
        'run-one "b_fp8_vs_nvfp4"',
    ):
        assert needle in text, needle
    assert not re.search(r"@[A-Z_]+@", text)  # every field filled in
    lines = (where / "runs.txt").read_text().splitlines()
    assert len(lines) == 15 and lines[0] == "bf16 1" and lines[-1] == "nvfp4 5"
    assert subprocess.run(["bash", "-n", str(where / "array.sbatch")]).returncode == 0
    rendered = run_and_kill_on_timeout(
        ["bash", str(where / "array.sbatch")],
        timeout=60,
        env=dict(os.environ, DRY_RUN="1", SLURM_ARRAY_TASK_ID="7", SLURM_JOB_ID="42"),
    )
    assert rendered.returncode == 0, rendered.stderr
    assert "nvfp4train.reproduce" in rendered.stdout and "--index 7" in rendered.stdout


def test_no_verb_carries_archives():
    helped = reproduce("--help")
    assert helped.returncode == 0
    for verb in ("plan", "run", "status", "copy-results", "report"):
        assert verb in helped.stdout
        assert reproduce(verb, "--help").returncode == 0
    for gone in ("pack-data", "pack-kernels", "unpack-kernels", "collect", "ingest", "launch", "wait"):
        proc = reproduce(gone)
        assert proc.returncode == 2 and "invalid choice" in proc.stderr, gone
    package = REPO / "nvfp4train"
    assert not (package / "train" / "kernel_cache.py").exists() and not (package / "reproduce" / "runner.py").exists()
    for path in list((package / "reproduce").glob("*.py")) + list((package / "train").glob("*.py")):
        source = path.read_text()
        for word in ("tarfile", "extractall", "unpack_kernel", ".carry"):
            assert word not in source, (path, word)


def test_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "exp"
    bad.mkdir()
    (bad / "typo.yaml").write_text("tokens: 100\nseeds: [1]\nbaseline: a\narms: {a: []}\nseed: 3\n")
    for args, needle in [
        (["plan", "no_such_experiment"], "no_such_experiment"),
        (["plan", "a_fp8_vs_nvfp4", "--arms", "fp4_typo"], "fp4_typo"),
        (["--experiments-dir", str(bad), "plan", "typo"], "unknown key 'seed'"),
        (["run", "a_fp8_vs_nvfp4", "--device", "cuda", "--gpus", "x"], "--gpus"),
    ]:
        proc = reproduce(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_report_of_the_committed_runs(tmp_path):
    proc = reproduce("report", "--runs-dir", "docs/results/runs", "--out", str(tmp_path), "--no-figures")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "reproduction.md").read_text()
    section = text.split("### fp8_vs_nvfp4_long")[1].split("###")[0]
    # the paper's "< 1% over the stable phase" is a bound: one-sided, on validation in the training precision
    row = next(
        line
        for line in section.splitlines()
        if line.startswith(
            "| nvfp4 vs fp8_blockwise | in-training validation in training precision, 20–80% of tokens (16 seq/source)"
        )
    )
    assert "(n=3)" in row and "**reproduced** (one-sided 95% upper bound" in row and "| primary |" in row
    assert "final checkpoint's evaluation in BF16 (eval.json" in section
    assert "mixed GPUs: NVIDIA H100 80GB HBM3, NVIDIA H200" in text
    tier_a = text.split("## Tier A")[1].split("\n## ")[0]
    done, planned = map(int, re.search(r"(\d+) of the (\d+) runs its experiments plan are finished", tier_a).groups())
    committed = sum(1 for _ in (REPO / "docs/results/runs").glob("a_*/*/seed*/run.json"))
    assert planned == 69 and done == committed > 0, (done, planned, committed)


@pytest.mark.slow  # a preempted task and its requeued continuation: a few minutes on 2 shared CPU cores
def test_slurm_array_task_preempted_requeued_and_resumed(tmp_path, spawn):
    """One task of the rendered array under SLURM's preemption signal: SIGUSR1 to the batch shell ->
    the trainer checkpoints, run.json says interrupted, `scontrol requeue <job>` once, exit 0; the
    requeued task (the same script again) resumes and finishes. scontrol is a stand-in on PATH; the
    batch shell, the task and the trainer are real (on the CPU)."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY.replace("base: [", "base: [train.device=cpu, "))
    runs = tmp_path / "runs"
    rendered = reproduce(
        "run",
        "tiny",
        "--executor",
        "slurm",
        "--dry-run",
        "--runs-dir",
        str(runs),
        "--arms",
        "nvfp4",
        "--seeds",
        "2",
        experiments=experiments,
    )
    assert rendered.returncode == 0, rendered.stderr
    script = runs / "tiny" / "slurm" / "array.sbatch"
    calls, bin_dir = tmp_path / "scontrol_calls", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = cli_env(
        SLURM_JOB_ID=4242,
        SLURM_ARRAY_TASK_ID=0,
        OMP_NUM_THREADS=1,
        PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
    )
    run_dir = runs / "tiny" / "nvfp4" / "seed2"
    proc = spawn(
        ["bash", str(script)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line) >= 5:
            break
        assert proc.poll() is None, proc.communicate(timeout=60)[0][-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGUSR1)  # the batch shell only, as --signal=B: does
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-3000:]
    assert [line for line in calls.read_text().splitlines() if line.startswith("requeue")] == ["requeue 4242"]
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert list((run_dir / "checkpoints").glob("step_*"))
    again = run_and_kill_on_timeout(["bash", str(script)], cwd=REPO, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["state"] == "done" and info["attempts"] == 2 and info["eval_rc"] == 0, info
    assert calls.read_text().count("requeue") == 1


@pytest.mark.slow  # one 3-step run and three CLI starts: about half a minute on 2 shared CPU cores
def test_retry_failed_run_without_a_checkpoint_starts_afresh_and_keeps_its_history(tmp_path):
    """A run that failed after logging steps but before its first checkpoint: skipped without --retry-failed,
    its files untouched; with it, the failed attempt's trainer files move aside into seed1.replaced-<time>/
    (said in one line), the claim and run.json stay, and the run trains from scratch to done."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    quick = TINY.replace("tokens: 25600", "tokens: 768").replace("seeds: [1, 2]", "seeds: [1]")  # 3 steps
    quick = quick.replace("eval_points: 4", "eval_points: 0")  # no validation, no eval line: a quick run
    (experiments / "tiny.yaml").write_text(re.sub(r"\neval: .*\n", "\n", quick))
    runs = tmp_path / "runs"
    run_dir = runs / "tiny" / "bf16" / "seed1"
    run_dir.mkdir(parents=True)
    failed = {"state": "failed", "attempts": 1, "train_rc": 1, "eval_rc": None, "started": 1.0, "wall_s": 7.0}
    old = {
        "run.json": json.dumps(failed),
        "metrics.jsonl": "".join(json.dumps({"step": s, "loss": 9.0 - s}) + "\n" for s in (1, 2)),
        "config.yaml": "seed: 1\n",
        "train.log": "the failed attempt\n",
        "console.log": "the failed attempt's output\n",
    }
    for name, text in old.items():
        (run_dir / name).write_text(text)
    (run_dir / "checkpoints" / "step_00000002.tmp").mkdir(parents=True)  # a save it never finished
    command = ["run", "tiny", "--arms", "bf16", "--executor", "local", "--device", "cpu", "--runs-dir", str(runs)]

    skipped = reproduce(*command, experiments=experiments)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "skip tiny/bf16/seed1: failed (--retry-failed runs it again)" in skipped.stdout
    assert {name: (run_dir / name).read_text() for name in old} == old
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["seed1"]

    retried = reproduce(*command, "--retry-failed", experiments=experiments)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    (aside,) = [p for p in run_dir.parent.iterdir() if p.name.startswith("seed1.replaced-")]
    assert (
        f"tiny/bf16/seed1: failed before its first checkpoint; its history is kept in {aside}; starting afresh"
        in retried.stdout.splitlines()
    ), retried.stdout
    assert "1 of 1 run(s) done" in retried.stdout and "Traceback" not in retried.stdout + retried.stderr
    for name in ("metrics.jsonl", "config.yaml", "train.log"):
        assert (aside / name).read_text() == old[name]
    assert (aside / "checkpoints" / "step_00000002.tmp").is_dir()
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl", "train.log"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["state"] == "done" and info["attempts"] == 2 and info["started"] == 1.0 and info["wall_s"] > 7.0
    assert set(info["corpus"]) == {
        f"{name}/{split}" for name in ("literature", "encyclopedic", "code") for split in ("train", "val")
    }
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1] == 3
    assert (run_dir / "console.log").read_text().startswith(old["console.log"])
    assert not (run_dir / "executor.json").exists()
