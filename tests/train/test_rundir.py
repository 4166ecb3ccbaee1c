"""The run directory's guards, built the way the damage happens: a second process, a kill, a resume
from an older checkpoint, non-finite weights."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from nvfp4train.train import checkpoint, rundir
from nvfp4train.train.rundir import RunDirError
from tests.conftest import REPO, cli_env, read_metrics, run_train, train_cmd
from tests.train.test_checkpoint import make, save, train_steps


def test_second_process_is_refused_and_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from nvfp4train.train.rundir import RunDirLock
        RunDirLock({str(tmp_path)!r}).acquire()
        print("locked", flush=True)
        time.sleep(600)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"in use by another run \(pid {holder.pid} on "):
            rundir.RunDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with rundir.RunDirLock(tmp_path):  # the kernel dropped the dead holder's lock
        pass


def test_fresh_start_refuses_an_existing_run_unless_overwrite_moves_it_aside(tmp_path):
    out = tmp_path / "run"
    assert rundir.check_fresh_start(out, overwrite=False) is None  # nothing there yet
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "config.yaml").write_text("seed: 1\n")
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics.jsonl\).*train.overwrite=true"):
        rundir.check_fresh_start(out, overwrite=False)
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    aside = rundir.check_fresh_start(out, overwrite=True)
    assert (aside / "metrics.jsonl").read_text() == '{"step": 1}\n' and (aside / "config.yaml").is_file()
    assert out.is_dir() and not any(out.iterdir()) and aside.parent == out.parent


def test_resume_from_an_older_checkpoint_abandons_the_later_ones_and_pruning_keeps_the_new(tmp_path):
    model, engine = make()
    for step in (4, 8, 12):
        save(tmp_path, step, model, engine, keep_last=3)
    moved = rundir.abandon_later(tmp_path, 4)  # resume from step 4
    assert sorted(p.name for p in moved.iterdir()) == ["step_00000008", "step_00000012"]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000004"]
    for step in (6, 7):  # the new timeline
        save(tmp_path, step, model, engine, keep_last=2)
    # the checkpoint just written survives, and auto-resume's "latest" is on this timeline
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000006", "step_00000007"]


def test_prune_never_deletes_checkpoints_newer_than_the_one_written(tmp_path):
    model, engine = make()
    for step in (4, 8):
        save(tmp_path, step, model, engine, keep_last=5)
    save(tmp_path, 5, model, engine, keep_last=1)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000005", "step_00000008"]


def test_kill_during_pruning_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    model, engine = make()
    save(tmp_path, 1, model, engine, keep_last=3)
    real_rmtree = checkpoint.shutil.rmtree

    def killed_half_way(path, *a, **k):
        victim = sorted(p for p in path.rglob("*") if p.is_file())
        victim[-1].unlink()  # some files gone (meta.json last in name order) ...
        raise KeyboardInterrupt  # ... then the process dies

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, model, engine, keep_last=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000002"]
    assert (tmp_path / "step_00000001.deleting").exists()
    save(tmp_path, 3, model, engine, keep_last=1)  # the next save cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003"]


def test_a_half_deleted_checkpoint_is_removed_when_the_run_starts_again(tmp_path):
    """What a kill during pruning leaves (a `.deleting` directory) goes at the next start, even one
    that then has nothing to do and saves nothing."""
    args = (f"out_dir={tmp_path}", "train.max_steps=2", "train.save_every=1", "train.eval_every=0")
    run_train(*args)
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(ckpts / "step_00000002", ckpts / "step_00000001.deleting")
    proc = run_train(*args)
    assert "nothing to do" in proc.stdout + proc.stderr
    assert not (ckpts / "step_00000001.deleting").exists()
    assert (ckpts / "step_00000002" / "meta.json").is_file()


def test_state_is_finite_sees_a_single_bad_weight_or_moment(tmp_path):
    model, engine = make()
    train_steps(model, engine, 1)
    assert bool(engine.state_is_finite())
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.inf
    assert not bool(engine.state_is_finite())
    model, engine = make()
    train_steps(model, engine, 1)
    next(iter(engine.optimizer.state.values()))["exp_avg_sq"].view(-1)[3] = math.nan
    assert not bool(engine.state_is_finite())


def test_disk_full_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    """A real write failure: the kernel's file-size limit (EFBIG) stops the save of step 4's weights;
    step 2's checkpoint, written before the limit was lowered, stays the one to resume from."""
    import resource

    out = tmp_path / "run"
    args = [
        f"out_dir={out}",
        "train.save_every=2",
        "train.progress=false",
        "train.eval_sequences=2",
        "train.seq_len=64",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
    ]
    subprocess.run(train_cmd(*args, "train.max_steps=4"), cwd=REPO, env=cli_env(), check=True, capture_output=True)
    shutil.rmtree(out / "checkpoints" / "step_00000004")  # as if killed after step 2's checkpoint
    size = max(p.stat().st_size for p in out.rglob("*.distcp"))

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    proc = subprocess.run(
        train_cmd(*args, "train.max_steps=4"),
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "step_00000004: cannot write the checkpoint (" in lines[0], lines[0][-400:]
    assert "step_00000002 is intact" in lines[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]


# ------------------------------------------------------------------------------- through the CLI

SMALL = [
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
]


def _one_error_line(proc, code):
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


def test_non_finite_learning_rate_is_refused_before_anything_is_written(tmp_path):
    for lr in ("inf", "nan"):
        line = _one_error_line(run_train(f"out_dir={tmp_path / 'r'}", *SMALL, f"optim.lr={lr}", check=False), 2)
        assert f"optim.lr={lr}: must be a finite number" in line
    assert not (tmp_path / "r").exists()


def _poison_embedding_row(ckpt):
    """Set one embedding row of a checkpoint to NaN, as a bad update would: a token the data never holds
    (a padded vocabulary row), so the loss stays finite while the weights do not."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    dcp_dir, plain = ckpt / "model_optim", ckpt.parent / "plain.pt"
    dcp_to_torch_save(dcp_dir, plain)
    state = torch.load(plain, weights_only=True)
    state["model"]["embedding.weight"][-1] = math.nan
    torch.save(state, plain)
    shutil.rmtree(dcp_dir)
    torch_save_to_dcp(plain, dcp_dir)
    plain.unlink()


def test_a_checkpoint_with_non_finite_weights_is_not_resumed_and_nothing_is_pruned_for_it(tmp_path):
    out = tmp_path / "run"
    common = [f"out_dir={out}", *SMALL, "train.max_steps=6", "train.save_every=2"]
    run_train(*common)
    shutil.rmtree(out / "checkpoints" / "step_00000006")  # as if killed after step 4's checkpoint
    _poison_embedding_row(out / "checkpoints" / "step_00000004")
    metrics = (out / "metrics.jsonl").read_bytes()
    proc = run_train(*common, "train.keep_last=1", check=False)
    line = _one_error_line(proc, 2)
    assert "step_00000004: embedding.weight holds NaN or inf values" in line and "train.resume=<path>" in line
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")] == ["step_00000002", "step_00000004"]


def test_a_run_ending_on_a_non_finite_loss_exits_non_zero_and_keeps_the_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    run_train(f"out_dir={out}", *SMALL, "train.max_steps=6", "train.save_every=2", "train.keep_last=2")
    shutil.rmtree(out / "checkpoints" / "step_00000006")  # as if killed after step 4's checkpoint
    # step 5 applies an update with a huge learning rate: step 6's loss overflows
    proc = run_train(
        f"out_dir={out}",
        *SMALL,
        "train.max_steps=6",
        "train.save_every=2",
        "train.keep_last=1",
        "optim.lr=1e30",
        "optim.min_lr=0",
        check=False,
    )
    line = _one_error_line(proc, 3)
    assert "step 6: the run ends on a step with a non-finite loss, so no checkpoint was written" in line
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")] == ["step_00000004"]


def test_the_step_that_trips_the_halt_is_logged(tmp_path):
    out = tmp_path / "run"
    proc = run_train(
        f"out_dir={out}",
        *SMALL,
        "train.max_steps=10",
        "train.max_nonfinite_steps=2",
        "optim.lr=1e30",
        "optim.min_lr=0",
        "optim.schedule.warmup_steps=0",
        check=False,
    )
    line = _one_error_line(proc, 3)
    assert "2 steps in a row had a non-finite loss" in line and "no checkpoint was written" in line
    records = read_metrics(out)
    assert records[-1]["step"] == 3 and records[-1]["step_skipped"] and records[-1]["loss"] is None
    assert not (out / "checkpoints").exists() or not checkpoint.list_checkpoints(out / "checkpoints")


def test_resume_never_on_an_existing_run_refuses_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    run_train(f"out_dir={out}", *SMALL, "train.max_steps=2")
    before = {p.name: p.read_bytes() for p in (out / "metrics.jsonl", out / "config.yaml")}
    line = _one_error_line(
        run_train(f"out_dir={out}", *SMALL, "train.max_steps=2", "train.resume=never", "seed=7", check=False), 2
    )
    assert "already holds a run" in line and "train.overwrite=true" in line
    assert {p.name: p.read_bytes() for p in (out / "metrics.jsonl", out / "config.yaml")} == before
    run_train(f"out_dir={out}", *SMALL, "train.max_steps=2", "train.resume=never", "seed=7", "train.overwrite=true")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]
    assert (aside[0] / "checkpoints" / "step_00000002" / "meta.json").is_file()
    assert "seed: 7" in (out / "config.yaml").read_text() and len(read_metrics(out)) == 2


def test_resume_from_an_older_checkpoint_starts_a_new_timeline(tmp_path):
    out = tmp_path / "run"
    common = [f"out_dir={out}", *SMALL, "train.max_steps=6", "train.save_every=2", "train.keep_last=2"]
    run_train(*common)
    resumed = run_train(*common, f"train.resume={out / 'checkpoints' / 'step_00000004'}")
    assert "a new timeline starts at step 4" in resumed.stdout
    abandoned = list((out / "checkpoints" / "abandoned").iterdir())
    assert len(abandoned) == 1 and (abandoned[0] / "step_00000006" / "meta.json").is_file()
    assert [json.loads(x)["step"] for x in (abandoned[0] / "metrics.jsonl").read_text().splitlines()] == [5, 6]
    # the checkpoint just written survived pruning, and "latest" is on the new timeline
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")] == ["step_00000004", "step_00000006"]
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]


def test_a_second_run_on_the_same_out_dir_is_refused_and_a_killed_run_leaves_no_lock(tmp_path):
    out = tmp_path / "run"
    args = [f"out_dir={out}", *SMALL, "train.max_steps=100000"]
    first = subprocess.Popen(
        train_cmd(*args), cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        t0 = time.time()
        while not (out / "metrics.jsonl").exists() or not read_metrics(out):
            assert first.poll() is None and time.time() - t0 < 300
            time.sleep(0.1)
        line = _one_error_line(run_train(*args, check=False), 2)
        assert "is in use by another run (pid" in line
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    line = _one_error_line(run_train(*args[:-1], "train.max_steps=2", "train.resume=never", check=False), 2)
    assert "already holds a run" in line  # refused for its history, not a stale lock


@pytest.mark.gpu
def test_state_is_finite_with_cuda_weights_and_cpu_step_counters():
    """Measured on 2x H200: AdamW's CPU `step` tensors next to CUDA moments broke the check (torch.cat
    across devices) at the first save of every GPU run."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tensors = [torch.ones(3, device="cuda"), torch.tensor(1.0)]
    assert bool(checkpoint.tensors_are_finite(tensors))
    tensors[0][1] = math.inf
    assert not bool(checkpoint.tensors_are_finite(tensors))
