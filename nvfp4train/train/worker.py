"""`python -m nvfp4train.train.worker`: train run after run in one process, for the reproduction's local
executor (`python -m nvfp4train.reproduce run ... --runs-per-process N`).

Why: a reproduction is many short runs on one GPU, and each process of its own imports torch, starts CUDA,
loads the compiled kernels and exits again, seconds of every run. A worker does that once; each run is still
the command `python -m nvfp4train.train ARGS` would be, through the same entry point (train/__main__.py): the
same checks, refusals and exit codes, and the same numbers (compile caches start fresh for every run:
engines/torch.py).

The executor writes one request per line on the worker's stdin, a JSON object `{"args": [override, ...],
"console": path}`; the run's output (file descriptors 1 and 2) is appended to `console`, and the worker answers
on its own stdout with one line `{"rc": exit status, "stopped": bool}`. An empty line or the end of stdin ends
it; so do a stop signal (the run checkpoints and stops, as the trainer does alone) and an error that is not a
run's own refusal (exit status 1: the process may no longer be sound, e.g. after a CUDA error).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback


def request_of(line: str) -> tuple[list[str], str]:
    """(the overrides, the console file) of one request line; ValueError naming what is wrong."""
    try:
        request = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"a request is not JSON ({e.msg})") from None
    if not isinstance(request, dict) or set(request) != {"args", "console"}:
        raise ValueError('a request is a JSON object with exactly the keys "args" and "console"')
    args, console = request["args"], request["console"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError('a request\'s "args" is a list of strings (the overrides of python -m nvfp4train.train)')
    if not isinstance(console, str) or not console:
        raise ValueError("a request's \"console\" is the path of the run's console log")
    return args, console


def train_once(args: list[str], console: str) -> tuple[int, bool]:
    """One run, as `python -m nvfp4train.train ARGS` with its output appended to `console`: (exit status,
    whether a stop signal ended it)."""
    from nvfp4train.train import __main__ as train
    from nvfp4train.train.stop import StopSignal

    # the executor checked the run directory; the log itself is never written through a link
    fd = os.open(console, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    stop = StopSignal.install()  # the trainer's handlers, as train/__main__ installs them before its imports
    sys.argv = [sys.argv[0], *args]
    rc = 0
    try:
        train.main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - said in the run's console, as an uncaught error would be
        traceback.print_exc()
        rc = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for d in saved:
            os.close(d)
    stopped = stop.received is not None
    stop.restore()  # between runs a stop signal ends the worker (the default action)
    _release_memory()
    return rc, stopped


def _release_memory() -> None:
    """What the run left: its CUDA graphs, model and caches, before the next run allocates its own."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main() -> None:
    control = os.fdopen(os.dup(1), "w", buffering=1)  # the answers; fd 1 itself goes to each run's console
    for line in sys.stdin:
        if not line.strip():
            break
        try:
            args, console = request_of(line)
        except ValueError as e:
            control.write(json.dumps({"rc": 2, "stopped": False, "error": str(e)}) + "\n")
            continue
        rc, stopped = train_once(args, console)
        control.write(json.dumps({"rc": rc, "stopped": stopped}) + "\n")
        if stopped or rc == 1:
            break


if __name__ == "__main__":
    main()
