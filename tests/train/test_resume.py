"""Exact resume: a run killed with SIGKILL after a checkpoint, then resumed, repeats the uninterrupted
run's per-step losses bit for bit on CPU. SIGTERM (preemption) checkpoints and exits cleanly."""

import json
import shutil
import signal
import subprocess
import time

from tests.conftest import REPO, cli_env, read_metrics, run_train, train_cmd

COMMON = [
    "train.max_steps=16",
    "train.save_every=4",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "precision=nvfp4",
]


def _wait_for(path, proc, timeout=300):
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
        assert time.time() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


def test_sigkill_then_resume_is_bitwise_identical(tmp_path, spawn):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    run_train(f"out_dir={ref}", *COMMON)
    proc = spawn(
        train_cmd(f"out_dir={cut}", *COMMON),
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(cut / "checkpoints" / "step_00000004" / "meta.json", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_steps = [r["step"] for r in read_metrics(cut)]
    assert killed_steps[-1] < 16, "the run finished before it could be killed"
    resumed = run_train(f"out_dir={cut}", *COMMON)
    assert "resumed from" in resumed.stdout
    a = {r["step"]: r["loss"] for r in read_metrics(ref)}
    b = {r["step"]: r["loss"] for r in read_metrics(cut)}
    assert sorted(b) == sorted(a) == list(range(1, 17))
    assert all(a[s] == b[s] for s in a), [(s, a[s], b[s]) for s in a if a[s] != b[s]][:5]


def test_sigterm_checkpoints_and_exits_cleanly(tmp_path, spawn):
    out = tmp_path / "run"
    args = [f"out_dir={out}", "train.max_steps=400", "train.log_every=1", "train.progress=false"]
    proc = spawn(train_cmd(*args), cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(out / "metrics.jsonl", proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "checkpoint" in stdout and "requeued" in stdout
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    assert len(ckpts) == 1 and int(ckpts[0].name[5:]) < 400
    step = int(ckpts[0].name[5:])
    assert read_metrics(out)[-1]["step"] == step


def test_checkpoint_of_another_model_is_refused_before_training(tmp_path):
    out = tmp_path / "run"
    args = [
        f"out_dir={out}",
        "train.max_steps=2",
        "train.progress=false",
        "train.eval_sequences=2",
        "train.seq_len=64",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
    ]
    run_train(*args)
    before = (out / "metrics.jsonl").read_text()
    proc = run_train(*args, "train.max_steps=4", "model.d_model=64", check=False)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "written for another model" in line and "d_model (128 in the checkpoint, 64 now)" in line
    assert (out / "metrics.jsonl").read_text() == before  # nothing trained, nothing overwritten


def test_wandb_offline_run_continues_after_resume(tmp_path):
    out = tmp_path / "run"
    args = [
        f"out_dir={out}",
        "train.max_steps=4",
        "train.save_every=2",
        "train.progress=false",
        "train.eval_sequences=2",
        "train.seq_len=64",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
        "train.wandb.enabled=true",
        "experiment=wb",
    ]
    run_train(*args)
    first_id = json.loads((out / "checkpoints" / "step_00000004" / "meta.json").read_text())["wandb_id"]
    assert first_id
    shutil.rmtree(out / "checkpoints" / "step_00000004")
    run_train(*args)
    second_id = json.loads((out / "checkpoints" / "step_00000004" / "meta.json").read_text())["wandb_id"]
    assert second_id == first_id
    runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(first_id) for r in runs)
