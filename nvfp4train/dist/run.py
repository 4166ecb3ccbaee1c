"""`python -m nvfp4train.dist.run [torchrun options] -m nvfp4train.train [overrides]`: torchrun whose
failures end in one line and the failing rank's exit code.

Stock torchrun answers any worker's non-zero exit with its own Python traceback and a ChildFailedError
box, and exits with 1 whatever the worker's code was. This launcher takes the same options (it is
torch.distributed.run underneath) and:
  - checks a training run's overrides and values before starting any worker: a bad key or value is one
    line and exit 2, in a second, whatever the number of processes;
  - keeps torchrun's own log lines (rendezvous, OMP_NUM_THREADS, "closing signal") quiet;
  - when a worker fails, prints the first failure's line (the `error: ...` the worker recorded in its
    error file, dist/errors.py) and exits with that worker's exit code (128 + N for a signal N).
"""
from __future__ import annotations

import logging
import os
import signal
import sys

from nvfp4train.dist.errors import LAUNCHER_PRINTS

TRAIN_MODULE = "nvfp4train.train"


def precheck(training_args: list[str]) -> str | None:
    """The one-line refusal of nvfp4train.train's command line, or None when it composes and checks.
    Hydra's own flags (--help, --cfg, sweeps) are left to the workers."""
    from hydra._internal.utils import get_args_parser

    from nvfp4train.config import ConfigError, check_hydra_flags, load

    try:
        args = get_args_parser().parse_args(training_args)
    except SystemExit:
        return None  # argparse printed its usage; the workers will say it again
    try:
        check_hydra_flags(args)
    except ConfigError as e:
        return f"error: {e}"
    if args.multirun or args.cfg or args.help or args.hydra_help or args.info or args.shell_completion:
        return None
    try:
        load("train", args.overrides)
    except ConfigError as e:  # compose and load turn Hydra's and OmegaConf's errors into one line too
        return f"error: {e}"
    return None


def _quiet_torchrun_logs() -> None:
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def failure_line(exc, script: str) -> tuple[str, int]:
    """The line to print for torchrun's ChildFailedError and the exit code to end with."""
    rank, failure = exc.get_first_failure()
    message = failure.message
    if isinstance(message, dict):  # a worker's @record traceback: its message, not the stack
        message = message.get("message", "")
    message = " ".join(str(message).split())
    if failure.exitcode < 0:
        code = 128 - failure.exitcode
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        return f"error: {script}: rank {rank} was killed by {name}", code
    if message.startswith("error: "):
        return message, failure.exitcode
    return (f"error: {script}: rank {rank} exited with code {failure.exitcode} (its output above says why)",
            failure.exitcode)


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    if args.module and args.training_script == TRAIN_MODULE:
        refusal = precheck(list(args.training_script_args))
        if refusal:
            print(refusal, file=sys.stderr)
            sys.exit(2)
    if "OMP_NUM_THREADS" not in os.environ and args.nproc_per_node not in ("1", 1):
        os.environ["OMP_NUM_THREADS"] = "1"  # what torchrun sets, without its banner about it
    os.environ[LAUNCHER_PRINTS] = "1"
    _quiet_torchrun_logs()
    try:
        run(args)
    except ChildFailedError as e:
        line, code = failure_line(e, args.training_script)
        print(line, file=sys.stderr)
        sys.exit(code or 1)
    except SignalException as e:  # SIGTERM/SIGINT to the launcher: torchrun has passed it to the workers
        sys.exit(128 + int(e.sigval))


if __name__ == "__main__":
    main()
