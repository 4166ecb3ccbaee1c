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
    write_atomic(path, data)       the run's small files (config.yaml, metrics.jsonl when cut back on
                                   resume) are written to a temporary file, fsynced and renamed into
                                   place: a full disk leaves the previous file whole, never an empty one
    open_own(path, flags)          every file written in a run directory is opened through this: never
                                   through a symbolic link, a file with a second hard link or a FIFO or
                                   device (a run directory may come from someone else: a copied result,
                                   an unpacked tarball), refused in one line before a byte is truncated
    check_own_files(out_dir)       the same check for all of the run's own files at once, before the run
                                   writes any of them
    save_config(out_dir, text, step)
                                   config.yaml, keeping a resumed run's previous one as
                                   config.step_<N>.yaml (never overwriting one kept earlier)
    history_held(out_dir), move_aside(out_dir, keep)
                                   what of a run's history a start from scratch would rewrite, and
                                   moving the run's own entries into `<out_dir>.replaced-<time>/`
                                   (also the reproduction executor's, retrying a run that failed
                                   before its first checkpoint)
Only the main rank calls these; the caller shares the outcome with the other ranks.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
from pathlib import Path

from nvfp4train.config import ConfigError
from nvfp4train.runs import RESOLVED
from nvfp4train.train import checkpoint

LOCK = ".lock"
ABANDONED = "abandoned"


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; the message names it and what to do (exit 2)."""


class RunWriteError(RunDirError):
    """A file of the run could not be written (disk full, quota, file-size limit): one line naming it."""


WHY_NOT_WRITTEN = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file-size limit reached: see ulimit -f",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def write_failed(path: Path, e: OSError) -> RunWriteError:
    why = WHY_NOT_WRITTEN.get(e.errno) or e.strerror or type(e).__name__
    return RunWriteError(f"{path}: cannot write ({why})")


def _not_own(path: Path, st: os.stat_result) -> RunDirError | None:
    """Why a run directory's file with this (l)stat is not one to write into; None if it is."""
    if stat.S_ISLNK(st.st_mode):
        what = f"is a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
        what = f"is not a regular file ({kind})"
    elif st.st_nlink > 1:
        what = f"has {st.st_nlink} hard links (writing it would change the other names too)"
    else:
        return None
    return RunDirError(f"{path} {what}; a run directory's files must be its own: remove it or choose another out_dir")


def check_own(path: Path) -> None:
    """Refuse a file of a run directory that writing would follow out of it (see open_own); a missing one is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise write_failed(Path(path), e) from None
    problem = _not_own(Path(path), st)
    if problem is not None:
        raise problem


def open_own(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open(path, flags) for writing a file of a run directory, refusing (RunDirError, one line) a symbolic
    link (O_NOFOLLOW: also one that appears between the check and the open), a file with more than one hard
    link and anything but a regular file. O_TRUNC is applied only after these checks, so a refused file keeps
    its bytes. The parent directory is the caller's: the run directory itself, which may be a link."""
    path = Path(path)
    check_own(path)  # the clear message; the checks below close the race
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            check_own(path)
        raise write_failed(path, e) from None
    try:
        problem = _not_own(path, os.fstat(fd))
        if problem is not None:
            raise problem
        os.set_blocking(fd, True)
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except OSError as e:
        os.close(fd)
        raise write_failed(path, e) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` whole or not at all: a temporary file beside it, fsynced, renamed. `path`
    must be the run's own (check_own); the temporary file is always a new one (a link left there is removed,
    never written through)."""
    path = Path(path)
    check_own(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.unlink(tmp)  # a leftover (or a planted link): unlinking a name never touches what it points to
        fd = open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, e) from None


# Every file a run, its evaluation and the reproduction executor write in out_dir (checkpoints/ is the
# checkpoints' own: train/checkpoint.py).
OWN_FILES = (
    LOCK,
    "config.yaml",
    "config.yaml.new",
    "metrics.jsonl",
    "metrics.jsonl.damaged",
    "train.log",
    "eval.json",
    "run.json",
    "executor.json",
    "console.log",
)


def check_own_files(out_dir: Path) -> None:
    """Refuse an out_dir any of whose own files (OWN_FILES) is a link, a file with a second hard link or not a
    regular file: before the run writes (or truncates) any of them."""
    for name in OWN_FILES:
        check_own(Path(out_dir) / name)


def config_part(text: str) -> str:
    """config.yaml's text without its last section, `resolved:` (the trainer's decisions, which another
    machine or terminal makes differently: train/plan.py), so that the same config compares equal."""
    head, found, _ = text.partition(f"\n{RESOLVED}:\n")
    return head + "\n" if found else text


def save_config(out_dir: Path, text: str, resumed_step: int | None) -> Path | None:
    """Write config.yaml; on a resume that changes it, keep the previous one as config.step_<N>.yaml (or
    config.step_<N>~k.yaml when that name is taken: a kept config is never overwritten). Return where the
    previous one went. The new file is written before the old one moves, so a failed write changes nothing."""
    path = Path(out_dir) / "config.yaml"
    check_own(path)
    try:
        old = path.read_text() if resumed_step is not None and path.is_file() else None
    except (OSError, UnicodeDecodeError):
        old = None
    if old == text:
        return None
    write_atomic(path.with_name("config.yaml.new"), text)
    kept = None
    # an empty config.yaml (a failed write of an older version) is not worth keeping, nor one whose decisions
    # alone differ (resolved:, made again at each start)
    if old and old.strip() and config_part(old) != config_part(text):
        kept, n = path.with_name(f"config.step_{resumed_step:08d}.yaml"), 1
        while os.path.lexists(kept) and not _holds(kept, old.encode()):
            kept, n = path.with_name(f"config.step_{resumed_step:08d}~{n}.yaml"), n + 1
        os.replace(path, kept)  # a rename: needs no space
    os.replace(path.with_name("config.yaml.new"), path)
    return kept


def _holds(path: Path, data: bytes) -> bool:
    """Whether `path` is a regular file (not a link, not a FIFO) holding exactly `data`."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode) and Path(path).read_bytes() == data
    except OSError:
        return False


class RunDirLock:
    """An exclusive, non-blocking flock held for the life of the run (or until `release`)."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        fd = open_own(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(
                f"out_dir={str(self.path.parent)!r} is in use by another run ({holder}); "
                "wait for it to finish or choose another out_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0
        )
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


def check_out_dir_place(out_dir: Path, data_cache: Path | None) -> None:
    """Refuse an out_dir inside another run's checkpoints (pruning and resume would treat the new run's
    files as that run's), or the data cache itself or a directory in it (the cache is rebuilt at will)."""
    here = Path(out_dir).resolve()
    for place in (here, *here.parents):
        if place.name == "checkpoints" and describe_run(place.parent) is not None:
            raise RunDirError(
                f"out_dir={str(out_dir)!r} is inside the checkpoints of the run in {place.parent}; "
                "choose a directory of its own"
            )
        if place.name.startswith(checkpoint.PREFIX) and (place / checkpoint.META).is_file():
            raise RunDirError(
                f"out_dir={str(out_dir)!r} is inside the checkpoint {place}; choose a directory of its own"
            )
    if data_cache is not None:
        cache = Path(data_cache).resolve()
        if here == cache or cache in here.parents:
            raise RunDirError(
                f"out_dir={str(out_dir)!r} is {'in ' if here != cache else ''}the data cache "
                f"(data.cache_dir: {cache}); choose a directory of its own"
            )


# What a run (and the tools that add to its directory) writes in out_dir: all that train.overwrite=true moves.
RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "metrics.jsonl.damaged",
    "train.log",
    "checkpoints",
    "wandb",
    "eval.json",
    "run.json",
    "executor.json",
)  # the last two: python -m nvfp4train.reproduce's record


def _is_run_entry(name: str) -> bool:
    return name in RUN_ENTRIES or (name.startswith("config.step_") and name.endswith(".yaml"))


def check_fresh_start(out_dir: Path, overwrite: bool) -> Path | None:
    """Before a run starts from scratch in `out_dir`: refuse if a run is there, or move it aside (the
    run's own files only: a directory shared with other files, `out_dir=.` say, keeps them in place).

    Returns where the old run went (None if there was none)."""
    out_dir = Path(out_dir).absolute()
    held = describe_run(out_dir)
    if held is None:
        return None
    if not overwrite:
        raise RunDirError(
            f"out_dir={str(out_dir)!r} already holds a run ({held}); train.resume=never would "
            "overwrite it: resume it (train.resume=auto), choose another out_dir, or pass "
            "train.overwrite=true to move the old run aside"
        )
    return move_aside(out_dir)


def move_aside(out_dir: Path, keep: tuple[str, ...] = ()) -> Path:
    """Move the run's own entries of `out_dir` (RUN_ENTRIES, config.step_*.yaml), but those named in `keep`,
    into a new sibling `<out_dir>.replaced-<time>/`; return it. A failed rename is one line (RunWriteError),
    and what moved before it is kept there."""
    out_dir = Path(out_dir).absolute()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = out_dir.with_name(f"{out_dir.name}.replaced-{stamp}"), 1
    while os.path.lexists(aside):
        aside, n = out_dir.with_name(f"{out_dir.name}.replaced-{stamp}~{n}"), n + 1
    try:
        aside.mkdir()
        for entry in sorted(out_dir.iterdir()):
            # the lock stays (this run holds it), and so does what is not the run's
            if _is_run_entry(entry.name) and entry.name not in keep:
                entry.rename(aside / entry.name)
    except OSError as e:
        raise write_failed(aside, e) from None
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


def check_checkpoints_dir(out_dir: Path) -> None:
    """`out_dir/checkpoints` must be a directory of this run (or absent) before anything is written or
    removed there: not a file, not a dangling link, not a link out of out_dir (saving and pruning would
    write and delete through it), and no `step_*.tmp` that is a link or a file (a save removes that
    name whole)."""
    out_dir = Path(out_dir)
    root = out_dir / "checkpoints"
    if root.is_symlink():
        target = root.resolve()
        if not target.exists():
            raise RunDirError(
                f"{root} is a link to {target}, which does not exist; remove the link or restore its target"
            )
        if out_dir.resolve() not in target.parents:
            raise RunDirError(
                f"{root} is a link out of the run directory (to {target}); checkpoints are written and pruned "
                "only inside out_dir: remove the link, or make out_dir itself a directory on that storage"
            )
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{root} is a file, not a directory of checkpoints; move it out of {out_dir}")
    if not root.is_dir():
        return
    for stale in sorted(root.glob(f"{checkpoint.PREFIX}*.tmp")):
        if stale.is_symlink() or not stale.is_dir():
            kind = "a link" if stale.is_symlink() else "a file"
            raise RunDirError(
                f"{stale} is {kind}, not a half-written checkpoint this trainer left; remove it, then run again"
            )


def history_held(out_dir: Path, config_text: str | None = None) -> list[str]:
    """The names of the run's history in `out_dir` that a start from scratch would rewrite: metrics.jsonl
    with records, and a config.yaml other than `config_text` (any config.yaml where it is None)."""
    metrics, config = Path(out_dir) / "metrics.jsonl", Path(out_dir) / "config.yaml"
    held = []
    if metrics.is_file() and metrics.stat().st_size:
        held.append("metrics.jsonl")
    try:
        if config.is_file() and (config_text is None or config_part(config.read_text()) != config_part(config_text)):
            held.append("config.yaml")
    except (OSError, UnicodeDecodeError):
        held.append("config.yaml")
    return held


def check_history_resumable(out_dir: Path, overwrite: bool, config_text: str) -> Path | None:
    """`train.resume=auto` found no checkpoint: refuse to start from scratch over a run's history
    (metrics records, or a config.yaml other than this run's), which the new run would rewrite; with
    `train.overwrite=true` move it aside as `train.resume=never` does. Return where it went."""
    out_dir = Path(out_dir).absolute()
    held = history_held(out_dir, config_text)
    if not held:
        return None
    if overwrite:
        return check_fresh_start(out_dir, overwrite=True) or move_aside(out_dir)
    raise RunDirError(
        f"out_dir={str(out_dir)!r} holds a run's history ({', '.join(held)}) but no complete checkpoint in "
        f"{out_dir / 'checkpoints'} to resume from, so train.resume=auto would start from scratch and rewrite "
        "it: pass train.overwrite=true to move the run's own entries aside into "
        "<out_dir>.replaced-<time>/ and start afresh, train.resume=<path> to resume from a checkpoint "
        "elsewhere, or choose another out_dir"
    )
