"""Ending a launched job whole: torchrun (and `python -m nvfp4train.launch`) starts each worker in a session
of its own, so a signal to the launcher's process group does not reach the workers, and workers whose
launcher was killed go on running (training to the end, holding their GPUs). The benchmarks, the GPU resume
checks and the tests that kill a job on purpose end it here: the launcher and every process under it.

Linux only (reads /proc). Imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    """Each live process's children, from /proc (a zombie counts as gone)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """The live processes under `pid` (children, their children, ...)."""
    children, found, todo = _children(), [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_tree(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGKILL to `proc` and every process under it, as a node failure would end them; returns once all are
    gone (reaping `proc`). The processes are listed first, then killed: a worker whose launcher died first
    would be re-parented out of reach."""
    pids = descendants(proc.pid)
    for pid in [*pids, proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    deadline = time.monotonic() + timeout
    while alive := set(pids) & {p for kids in _children().values() for p in kids}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {sorted(alive)} outlived SIGKILL for {timeout:.0f} s")
        time.sleep(0.05)


def run_and_kill_on_timeout(
    cmd: list[str], timeout: float, *, input: str | bytes | None = None, check: bool = False, **popen_kwargs
) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout) (those defaults, and its input,
    check and Popen arguments), except that a timeout ends the launched job whole (kill_tree), not only its
    first process: subprocess.run would then wait for pipes that the workers still hold, forever. Raises
    subprocess.TimeoutExpired with the output so far. An interrupt (Ctrl-C) also ends the job whole."""
    if popen_kwargs.pop("capture_output", True):
        popen_kwargs.setdefault("stdout", subprocess.PIPE)
        popen_kwargs.setdefault("stderr", subprocess.PIPE)
    popen_kwargs.setdefault("text", True)
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    with subprocess.Popen(cmd, **popen_kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            try:  # the pipes close with the job, unless a process that left it (re-parented) still holds them
                stdout, stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired as held:  # its output so far comes as bytes, even in text mode
                stdout, stderr = (
                    out.decode(errors="replace") if isinstance(out, bytes) and proc.text_mode else out
                    for out in (held.stdout, held.stderr)
                )
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr) from None
        except BaseException:  # Ctrl-C, a test's timeout: the job ends with its caller, workers included
            kill_tree(proc)
            raise
    completed = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if check:
        completed.check_returncode()
    return completed


__all__ = ["descendants", "kill_tree", "run_and_kill_on_timeout"]
