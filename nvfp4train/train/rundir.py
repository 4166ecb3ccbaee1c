"""The run directory as one timeline that no second run, no restart and no resume can corrupt.

    lock(out_dir)                  one run at a time: an flock on `out_dir/.lock`, released by the kernel
                                   when the process dies (a killed run never leaves it stuck)
    check_fresh_start(out_dir, overwrite)
                                   `train.resume=never` on a directory that already holds a run refuses,
                                   unless asked to overwrite, which moves the old run aside whole
                                   (into the sibling `<out_dir>.replaced-<time>/`)
    abandon_later(ckpt_root, step) resuming from an older checkpoint starts a new timeline: the later
                                   checkpoints move to `checkpoints/abandoned/` (kept, never resumed
                                   from or pruned by accident), so "latest" always means this timeline's
Only the main rank calls these; the caller shares the outcome with the other ranks.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from nvfp4train.train import checkpoint
from nvfp4train.train.config import ConfigError

LOCK = ".lock"
ABANDONED = "abandoned"


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; the message names it and what to do (exit 2)."""


class RunDirLock:
    """An exclusive, non-blocking flock held for the life of the run (or until `release`)."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "RunDirLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(f"out_dir={str(self.path.parent)!r} is in use by another run ({holder}); "
                              "wait for it to finish or choose another out_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
                  .encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def describe_run(out_dir: Path) -> str | None:
    """What a directory holds of an earlier run, in words; None when it holds none."""
    out_dir = Path(out_dir)
    ckpts = checkpoint.list_checkpoints(out_dir / "checkpoints")
    metrics = out_dir / "metrics.jsonl"
    parts = []
    if metrics.is_file() and metrics.stat().st_size:
        parts.append("metrics.jsonl")
    if ckpts:
        parts.append(f"{len(ckpts)} checkpoint(s) up to {ckpts[-1].name}")
    return ", ".join(parts) or None


def check_fresh_start(out_dir: Path, overwrite: bool) -> Path | None:
    """Before a run starts from scratch in `out_dir`: refuse if a run is there, or move it aside.

    Returns where the old run went (None if there was none)."""
    out_dir = Path(out_dir)
    held = describe_run(out_dir)
    if held is None:
        return None
    if not overwrite:
        raise RunDirError(f"out_dir={str(out_dir)!r} already holds a run ({held}); train.resume=never would "
                          "overwrite it: resume it (train.resume=auto), choose another out_dir, or pass "
                          "train.overwrite=true to move the old run aside")
    stamp = time.strftime('%Y%m%d-%H%M%S')
    aside, n = out_dir.with_name(f"{out_dir.name}.replaced-{stamp}"), 1
    while aside.exists():
        aside, n = out_dir.with_name(f"{out_dir.name}.replaced-{stamp}~{n}"), n + 1
    aside.mkdir()
    for entry in out_dir.iterdir():
        if entry.name != LOCK:  # the lock stays: this run holds it
            entry.rename(aside / entry.name)
    return aside


def abandon_later(ckpt_root: Path, step: int) -> Path | None:
    """Move the checkpoints after `step` out of the timeline; return where they went (None if none)."""
    later = [p for p in checkpoint.list_checkpoints(ckpt_root) if checkpoint.step_of(p) > step]
    later += [p for p in Path(ckpt_root).glob(f"{checkpoint.PREFIX}*.tmp")]  # half-written saves too
    if not later:
        return None
    dest = Path(ckpt_root) / ABANDONED / f"after_step_{step:08d}-{time.strftime('%Y%m%d-%H%M%S')}"
    dest.mkdir(parents=True, exist_ok=True)
    for p in later:
        p.rename(dest / p.name)
    return dest
