"""Hardening, round 2 (issue 38): the run directory survives a full disk, a diverging run keeps the
checkpoint to go back to, out_dir must be a place of its own, and refusals write nothing."""

import json
import resource
import signal

import numpy as np
import pytest

from nvfp4train.data import TokenShards, prepare_split
from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, read_metrics, run_train, train_cmd

ARGS = [
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
]


def _one_line(proc, code=2):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and "Traceback" not in proc.stderr, (
        f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return lines[0]


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def _train_with_file_size_limit(limit, *overrides):
    """The trainer in a process whose files cannot grow past `limit` bytes: a write past it fails with
    EFBIG as on a full disk (SIGXFSZ ignored, so the write returns the error instead of killing)."""

    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return run_and_kill_on_timeout(
        train_cmd(*overrides),
        cwd=REPO,
        env=cli_env(),
        timeout=600,
        preexec_fn=set_limit,
    )


def test_a_full_disk_outside_the_save_is_one_line_and_loses_nothing(tmp_path):
    out = tmp_path / "run"
    args = [f"out_dir={out}", *ARGS, "train.save_every=2"]
    run_train(*args, "train.max_steps=4")
    original = (out / "config.yaml").read_text()

    # 1. config.yaml cannot be written on resume: one line, the old config.yaml whole, nothing kept twice
    before = _files(out)
    line = _one_line(_train_with_file_size_limit(1000, *args, "train.max_steps=6"))
    assert "config.yaml" in line and "cannot write" in line, line
    assert _files(out) == before

    # 2. metrics.jsonl fills up at step 6: one line naming it and the checkpoint to resume from; no torn line
    # room for step 5's record (the first of a process: it carries the run plan's resolved/* fields), not step 6's
    line = _one_line(
        _train_with_file_size_limit(len((out / "metrics.jsonl").read_bytes()) + 2000, *args, "train.max_steps=6")
    )
    assert "metrics.jsonl: cannot write" in line and "step_00000004" in line, line
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5]  # read_metrics parses every line
    assert (out / "config.step_00000004.yaml").read_text() == original

    # 3. train.log cannot grow: one line naming it
    with open(out / "train.log", "a") as f:
        f.write("x" * 20000 + "\n")
    line = _one_line(_train_with_file_size_limit((out / "train.log").stat().st_size + 50, *args, "train.max_steps=6"))
    assert "train.log: cannot write" in line, line
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5]

    # 4. with space again the same command finishes; the first config is still the one kept
    run_train(*args, "train.max_steps=6")
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert (out / "config.step_00000004.yaml").read_text() == original
    assert not list(out.glob(".*.tmp")) and not (out / "config.yaml.new").exists()


def test_a_diverging_run_keeps_the_checkpoint_before_the_spike_and_points_at_it(tmp_path):
    out = tmp_path / "run"
    common = [
        f"out_dir={out}",
        *ARGS,
        "train.save_every=4",
        "train.keep_last=1",
        "optim.schedule.name=constant",
        "optim.schedule.warmup_steps=0",
        "train.max_nonfinite_steps=3",
    ]
    run_train(*common, "train.max_steps=24")
    # The same run continued at a learning rate that makes it diverge (finite, huge losses, then NaN), with a
    # checkpoint every step: where the first spike and the first NaN fall moves with the float arithmetic
    # (other package versions), but some checkpoints are written between them.
    proc = run_train(*common, "train.max_steps=48", "optim.lr=30", "optim.min_lr=0", "train.save_every=1", check=False)
    line = _one_line(proc, code=3)
    spikes = [r["step"] for r in read_metrics(out) if r.get("loss_spike")]
    assert spikes and spikes[0] > 24, spikes
    kept = sorted((out / "checkpoints").glob("step_*"))
    healthy = {p: json.loads((p / "meta.json").read_text())["healthy"] for p in kept}
    good = kept[-1] if all(healthy.values()) else max(p for p in kept if healthy[p])
    assert int(good.name.split("_")[1]) < spikes[0], (good, spikes)  # the last one before the first spike
    assert f"train.resume={good}" in line and "loss spike" in line, line
    later = [p for p in kept if p > good]
    assert later and not any(healthy[p] for p in later), healthy  # keep_last=1 kept `good` beside them


def test_out_dir_inside_a_run_or_the_data_cache_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    before = _files(tmp_path)
    line = _one_line(run_train(f"out_dir={run / 'checkpoints' / 'new'}", *ARGS, "train.max_steps=2", check=False))
    assert "inside the checkpoints of the run" in line, line
    line = _one_line(
        run_train(
            f"out_dir={tmp_path / 'cache'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *ARGS,
            "train.max_steps=2",
            check=False,
        )
    )
    assert "data cache" in line, line
    assert _files(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_refusals_write_nothing_in_out_dir(tmp_path):
    out = tmp_path / "new"
    line = _one_line(run_train(f"out_dir={out}", f"train.resume={tmp_path}", *ARGS, check=False))
    assert "not a checkpoint" in line, line
    # a wandb that cannot be imported (a stub package that fails as a missing one does)
    stub = tmp_path / "stub" / "wandb"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no wandb here')\n")
    env = cli_env(PYTHONPATH=f"{stub.parent}:{REPO}")
    proc = run_and_kill_on_timeout(
        train_cmd(f"out_dir={out}", "train.wandb.enabled=true", *ARGS),
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert "wandb" in _one_line(proc)
    assert not out.exists()


def test_overwrite_in_the_working_directory_moves_only_the_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    (work / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    proc = run_and_kill_on_timeout(
        train_cmd(
            "out_dir=.", "train.resume=never", "train.overwrite=true", *ARGS, "train.max_steps=2", "train.save_every=0"
        ),
        cwd=work,
        env=cli_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (work / "notes.txt").read_text() == "mine"
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("work.replaced-")]
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == ["metrics.jsonl"]
    assert [r["step"] for r in read_metrics(work)] == [1, 2]


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.bin", "sub/../../outside.bin"])
def test_a_manifest_naming_a_file_outside_its_directory_is_refused(tmp_path, name):
    (tmp_path / "docs.jsonl").write_text('{"text": "hello world"}\n')
    split = tmp_path / "shards"
    prepare_split([str(tmp_path / "docs.jsonl")], split, tokenizer="bpe8k", progress=False)
    manifest = json.loads((split / "manifest.json").read_text())
    np.zeros(4, np.uint16).tofile(tmp_path / "outside.bin")
    manifest["shards"][0]["file"] = name
    (split / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"shards\[0\]\.file .* not a file inside"):
        TokenShards(split)


def test_ab_array_index_past_the_arms_is_one_line(tmp_path):
    proc = run_and_kill_on_timeout(
        ["bash", str(REPO / "slurm" / "ab_array.sbatch"), "model=hybrid_tiny"],
        cwd=tmp_path,
        env=cli_env(DRY_RUN=1, SLURM_ARRAY_TASK_ID=3, ARMS="bf16 nvfp4"),
        timeout=60,
    )
    line = _one_line(proc)
    assert "SLURM_ARRAY_TASK_ID=3" in line and "--array=0-1" in line, line
    ok = run_and_kill_on_timeout(
        ["bash", str(REPO / "slurm" / "ab_array.sbatch")],
        cwd=tmp_path,
        env=cli_env(DRY_RUN=1, SLURM_ARRAY_TASK_ID=1, ARMS="bf16 nvfp4"),
        timeout=60,
    )
    assert ok.returncode == 0 and "precision=nvfp4" in ok.stdout, ok.stderr


# ------------------------------------------------------------------------------------------ round 3 (issue 61)
# A run directory may come from someone else (a copied result, an unpacked tarball): a link in it is never
# written through, nor a file with a second hard link, and the refusal comes before any file is truncated.
SECRET = b"the user's own file: must keep these bytes\n"


def _plant(run, name, how, target):
    if how == "symlink":
        (run / name).symlink_to(target)
    else:
        (run / name).hardlink_to(target)


@pytest.mark.parametrize(
    "name,how",
    [
        (".lock", "symlink"),
        ("train.log", "symlink"),
        ("metrics.jsonl.damaged", "symlink"),
        ("config.yaml", "hardlink"),
        ("metrics.jsonl", "hardlink"),
    ],
)
def test_a_link_in_the_run_directory_is_refused_before_anything_is_written(tmp_path, name, how):
    user_file = tmp_path / "user.txt"
    user_file.write_bytes(SECRET)
    run = tmp_path / "run"
    run.mkdir()
    _plant(run, name, how, user_file)
    line = _one_line(run_train(f"out_dir={run}", *ARGS, "train.max_steps=1", check=False))
    what = "is a symbolic link" if how == "symlink" else "has 2 hard links"
    assert line.startswith(f"error: {run / name} {what}") and "remove it or choose another out_dir" in line, line
    assert user_file.read_bytes() == SECRET
    assert sorted(p.name for p in run.iterdir()) == [name]  # nothing else written: no lock, no config.yaml


def test_a_link_planted_in_a_trained_run_is_refused_on_resume(tmp_path):
    run = tmp_path / "run"
    run_train(f"out_dir={run}", *ARGS, "train.max_steps=2", "train.save_every=1")
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{torn\n")  # a damaged line: the resume would set it aside into metrics.jsonl.damaged
    user_file = tmp_path / "user.txt"
    user_file.write_bytes(SECRET)
    (run / "metrics.jsonl.damaged").symlink_to(user_file)
    before = _files(run)
    line = _one_line(run_train(f"out_dir={run}", *ARGS, "train.max_steps=3", check=False))
    assert f"{run / 'metrics.jsonl.damaged'} is a symbolic link (to {user_file})" in line, line
    assert user_file.read_bytes() == SECRET and _files(run) == before


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_metrics_jsonl_that_is_a_fifo_or_dev_zero_is_one_line_not_a_hang(tmp_path, kind):
    import os

    run = tmp_path / "run"
    run_train(f"out_dir={run}", *ARGS, "train.max_steps=1", "train.save_every=1")
    (run / "metrics.jsonl").unlink()
    if kind == "fifo":
        os.mkfifo(run / "metrics.jsonl")
    else:
        (run / "metrics.jsonl").symlink_to("/dev/zero")
    proc = run_and_kill_on_timeout(
        train_cmd(f"out_dir={run}", *ARGS, "train.max_steps=2"), cwd=REPO, env=cli_env(), timeout=120
    )
    line = _one_line(proc)
    what = "is not a regular file (a FIFO)" if kind == "fifo" else "is a symbolic link (to /dev/zero)"
    assert f"{run / 'metrics.jsonl'} {what}" in line, line


def test_a_link_in_the_run_directory_is_refused_under_torchrun(tmp_path):
    from tests.conftest import run_torchrun

    user_file = tmp_path / "user.txt"
    user_file.write_bytes(SECRET)
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").symlink_to(user_file)
    args = [a for a in ARGS if not a.startswith("train.micro_batch_size=")]  # derived for 2 ranks
    proc = run_torchrun(f"out_dir={run}", *args, "train.max_steps=1", check=False, timeout=300)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert lines[0].startswith(f"error: {run / 'train.log'} is a symbolic link") and "Traceback" not in lines[0]
    assert user_file.read_bytes() == SECRET and sorted(p.name for p in run.iterdir()) == ["train.log"]


def test_out_dir_that_is_a_dangling_link_says_so(tmp_path):
    (tmp_path / "run").symlink_to(tmp_path / "gone")
    line = _one_line(run_train(f"out_dir={tmp_path / 'run'}", *ARGS, "train.max_steps=1", check=False))
    assert "is a symbolic link to" in line and "which does not exist" in line and "File exists" not in line, line


def test_the_run_directory_primitive_refuses_links_without_truncating(tmp_path):
    import os

    from nvfp4train.train import rundir

    user_file = tmp_path / "user.txt"
    user_file.write_bytes(SECRET)
    (tmp_path / "soft").symlink_to(user_file)
    (tmp_path / "hard").hardlink_to(user_file)
    (tmp_path / ".atomic.tmp").symlink_to(user_file)  # a planted temporary name
    for name in ("soft", "hard"):
        with pytest.raises(rundir.RunDirError, match="a run directory's files must be its own"):
            rundir.open_own(tmp_path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with pytest.raises(rundir.RunDirError, match="a run directory's files must be its own"):
            rundir.write_atomic(tmp_path / name, "overwritten")
    rundir.write_atomic(tmp_path / "atomic", "mine")  # the planted link is removed, not written through
    assert (tmp_path / "atomic").read_text() == "mine" and not os.path.lexists(tmp_path / ".atomic.tmp")
    assert user_file.read_bytes() == SECRET
