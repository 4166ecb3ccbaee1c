"""The run directory's guards, built the way the damage happens: a second process, a kill, a resume
from an older checkpoint, non-finite weights."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from nvfp4train.train import checkpoint, rundir
from nvfp4train.train.rundir import RunDirError
from tests.train.test_checkpoint import make, save, train_steps


def test_second_process_is_refused_and_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from nvfp4train.train.rundir import RunDirLock
        RunDirLock({str(tmp_path)!r}).acquire()
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"in use by another run \(pid {holder.pid} on "):
            rundir.RunDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with rundir.RunDirLock(tmp_path):      # the kernel dropped the dead holder's lock
        pass


def test_fresh_start_refuses_an_existing_run_unless_overwrite_moves_it_aside(tmp_path):
    out = tmp_path / "run"
    assert rundir.check_fresh_start(out, overwrite=False) is None           # nothing there yet
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "config.yaml").write_text("seed: 1\n")
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics.jsonl\).*train.overwrite=true"):
        rundir.check_fresh_start(out, overwrite=False)
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'            # untouched
    aside = rundir.check_fresh_start(out, overwrite=True)
    assert (aside / "metrics.jsonl").read_text() == '{"step": 1}\n' and (aside / "config.yaml").is_file()
    assert out.is_dir() and not any(out.iterdir()) and aside.parent == out.parent


def test_resume_from_an_older_checkpoint_abandons_the_later_ones_and_pruning_keeps_the_new(tmp_path):
    model, engine = make()
    for step in (4, 8, 12):
        save(tmp_path, step, model, engine, keep_last=3)
    moved = rundir.abandon_later(tmp_path, 4)                                # resume from step 4
    assert sorted(p.name for p in moved.iterdir()) == ["step_00000008", "step_00000012"]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000004"]
    for step in (6, 7):                                                       # the new timeline
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
        victim[-1].unlink()                    # some files gone (meta.json last in name order) ...
        raise KeyboardInterrupt                # ... then the process dies
    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, model, engine, keep_last=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000002"]
    assert (tmp_path / "step_00000001.deleting").exists()
    save(tmp_path, 3, model, engine, keep_last=1)                            # the next save cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003"]


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
    from tests.conftest import REPO, cli_env, train_cmd

    out = tmp_path / "run"
    args = [f"out_dir={out}", "train.save_every=2", "train.progress=false", "train.eval_sequences=2",
            "train.seq_len=64", "train.global_batch_size=4", "train.micro_batch_size=4"]
    subprocess.run(train_cmd(*args, "train.max_steps=4"), cwd=REPO, env=cli_env(), check=True,
                   capture_output=True)
    import shutil
    shutil.rmtree(out / "checkpoints" / "step_00000004")     # as if killed after step 2's checkpoint
    size = max(p.stat().st_size for p in out.rglob("*.distcp"))

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
    proc = subprocess.run(train_cmd(*args, "train.max_steps=4"), cwd=REPO, env=cli_env(), capture_output=True,
                          text=True, preexec_fn=small_files, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "step_00000004: cannot write the checkpoint (" in lines[0], lines[0][-400:]
    assert "step_00000002 is intact" in lines[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
