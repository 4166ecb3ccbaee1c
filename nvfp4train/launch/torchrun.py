"""`python -m nvfp4train.launch [torchrun options] -m nvfp4train.train [overrides]`: torchrun whose
failures end in one line and the failing rank's exit code.

Stock torchrun answers any worker's non-zero exit with its own Python traceback and a ChildFailedError
box, and exits with 1 whatever the worker's code was. This launcher takes the same options (it is
torch.distributed.run underneath) and:
  - checks a training run's overrides and values before starting any worker: a bad key or value is one
    line and exit 2, in a second, whatever the number of processes;
  - keeps torchrun's own log lines (rendezvous, OMP_NUM_THREADS, "closing signal") quiet;
  - when a worker fails, prints the first failure's line (the `error: ...` the worker recorded in its
    error file, launch/errors.py) and exits with that worker's exit code (128 + N for a signal N);
  - on SIGTERM or Ctrl-C (stock torchrun: its own SignalException traceback and exit 1), passes the signal
    to the workers, which checkpoint and say so in one line, waits up to --shutdown_timeout (default
    SHUTDOWN_TIMEOUT here, 30 s in torchrun: too short for a large model's checkpoint) and exits with the
    workers' exit code: 0 after SIGTERM (requeue), 130 after Ctrl-C; one line if a worker had to be killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys

from nvfp4train.launch.errors import LAUNCHER_PRINTS

TRAIN_MODULE = "nvfp4train.train"
SHUTDOWN_TIMEOUT = 300  # seconds a worker has, after SIGTERM, to finish its step and write its checkpoint


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


def _quiet_rendezvous_timer_stop() -> None:
    """torch's rendezvous keeps its lease alive on a daemon thread, stopped by a `weakref.finalize` that joins
    it (`_PeriodicTimer._stop_thread`). Where the garbage collector runs that finalizer on the timer's own
    thread, as the launcher exits, its exception would print "Exception ignored in: <finalize object ...>"
    after the launcher's one line. The thread is a daemon, so nothing is lost: that one is dropped; every
    other unraisable exception is printed as before."""
    default = sys.unraisablehook

    def hook(unraisable) -> None:
        tb = unraisable.exc_traceback
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "_stop_thread" and code.co_filename.endswith(
                os.path.join("elastic", "rendezvous", "utils.py")
            ):
                return
            tb = tb.tb_next
        default(unraisable)

    sys.unraisablehook = hook


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
    return (
        f"error: {script}: rank {rank} exited with code {failure.exitcode} (its output above says why)",
        failure.exitcode,
    )


@contextlib.contextmanager
def _recording_worker_exits():
    """{local rank: exit code} of the workers torchrun closes (on a signal to the launcher: after passing it
    on and waiting), read from its subprocess handlers; empty where this torch keeps them elsewhere."""
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    exits: dict[int, int] = {}
    close = SubprocessContext._close

    def recording_close(self, *args, **kwargs):
        try:
            close(self, *args, **kwargs)
        finally:
            for local_rank, handler in getattr(self, "subprocess_handlers", {}).items():
                proc = getattr(handler, "proc", None)
                try:  # a SIGKILLed worker is reaped a moment later (at once where the timeout is 0)
                    code = proc.wait(5) if proc is not None else None
                except subprocess.TimeoutExpired:
                    code = None  # in uninterruptible sleep: torchrun gives up on it too
                if code is not None:
                    exits[local_rank] = code

    SubprocessContext._close = recording_close
    try:
        yield exits
    finally:
        SubprocessContext._close = close


def stopped_line(sigval: int, exits: dict[int, int], script: str, shutdown_timeout: int) -> tuple[str | None, int]:
    """After a stop signal to the launcher: the line to print (None: the workers said it) and the exit code.
    The workers' own code where they all stopped alike (0 after SIGTERM: checkpointed, requeue; 130 after
    Ctrl-C), else the first one that did not, and 128 + the signal when no worker had started."""
    name = signal.Signals(sigval).name
    if not exits:
        return None, 128 + int(sigval)
    for local_rank, code in sorted(exits.items()):
        if code == -signal.SIGKILL:
            return (
                f"error: {script}: local rank {local_rank} did not stop within {shutdown_timeout} s of {name} "
                f"and was killed (its checkpoint was not written; raise --shutdown_timeout)"
            ), 137
    codes = set(exits.values())
    if len(codes) == 1:  # all alike: each rank has said its own line (checkpoint saved, or why not)
        code = codes.pop()
        return None, 128 - code if code < 0 else code
    local_rank, code = next((r, c) for r, c in sorted(exits.items()) if c != 0)
    return (
        f"error: {script}: after {name}, local rank {local_rank} exited with code {code} (its output above says why)"
    ), 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    if args.shutdown_timeout is None and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in os.environ:
        args.shutdown_timeout = SHUTDOWN_TIMEOUT
    shutdown_timeout = (
        args.shutdown_timeout
        if args.shutdown_timeout is not None
        else int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 30))
    )
    if args.module and args.training_script == TRAIN_MODULE:
        refusal = precheck(list(args.training_script_args))
        if refusal:
            print(refusal, file=sys.stderr)
            sys.exit(2)
    if "OMP_NUM_THREADS" not in os.environ and args.nproc_per_node not in ("1", 1):
        os.environ["OMP_NUM_THREADS"] = "1"  # what torchrun sets, without its banner about it
    os.environ[LAUNCHER_PRINTS] = "1"
    _quiet_torchrun_logs()
    _quiet_rendezvous_timer_stop()
    try:
        with _recording_worker_exits() as exits:
            run(args)
    except ChildFailedError as e:
        line, code = failure_line(e, args.training_script)
        print(line, file=sys.stderr)
        sys.exit(code or 1)
    except SignalException as e:  # SIGTERM/SIGINT to the launcher: torchrun has passed it to the workers
        line, code = stopped_line(e.sigval, exits, args.training_script, shutdown_timeout)
        if line:
            print(line, file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
