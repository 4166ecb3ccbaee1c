"""Stop signals: SIGTERM / SIGUSR1 (SLURM preemption) and SIGINT (Ctrl-C) end a run with a checkpoint.

The exit status tells them apart: a preemption exits 0 (SLURM requeues the job, and the same command
resumes), Ctrl-C exits 130 like any interrupted command, so that `train && eval` stops there.

Imports nothing heavy, so `python -m nvfp4train.train` installs the handlers before it imports torch: a
signal during start-up (imports, data preparation, model build, resume) ends the process with one line
instead of a traceback or a silent kill. Until the first step the handler raises StoppedBeforeFirstStep (a
BaseException, like KeyboardInterrupt, so no `except Exception` on the way swallows it; during torch's import,
when that import ends: `deferred`); from then on it only sets `received`, and the loop checkpoints after the
current step and leaves. A second Ctrl-C exits at once.
"""

from __future__ import annotations

import contextlib
import os
import signal


class StoppedBeforeFirstStep(BaseException):
    """A stop signal arrived while the run was starting: there is nothing new to save."""

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def exit_code(signum: int | None) -> int:
    """130 after Ctrl-C (128 + SIGINT, what a shell reports), 0 after a preemption signal (requeue)."""
    return 128 + signal.SIGINT if signum == signal.SIGINT else 0


class StopSignal:
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    _active: StopSignal | None = None

    def __init__(self):
        self.received: int | None = None
        self.starting = True
        self.deferring = False
        self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    @classmethod
    def install(cls) -> StopSignal:
        """The installed handler (one per run: restore() uninstalls it), or a new one."""
        if cls._active is None:
            cls._active = cls()
        return cls._active

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "none"

    def stopped(self) -> StoppedBeforeFirstStep:
        return StoppedBeforeFirstStep(
            f"received {self.name} before the first step: stopped, nothing to save", self.received
        )

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            os.write(2, b"interrupted again: exiting now, without a checkpoint\n")
            os._exit(130)
        self.received = signum
        if self.starting:
            if self.deferring:
                return  # raised when the deferred section ends
            self.starting = False  # raise once: the cleanup that runs next must not be interrupted again
            raise self.stopped()
        if signum == signal.SIGINT:
            os.write(2, b"\ninterrupted: saving a checkpoint after this step (Ctrl-C again to exit at once)\n")

    @contextlib.contextmanager
    def deferred(self):
        """Within it a start-up signal is only recorded, and raised on leaving. For importing native
        extensions (torch): an exception raised while C++ is calling back into Python cannot unwind through
        the C++ frames, and the process aborts (SIGABRT) instead of stopping with one line."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.starting and self.received is not None:
            self.starting = False
            raise self.stopped()

    def restore(self) -> None:
        for sig, handler in self.previous.items():  # the caller's handlers (pytest's, a sweep's next run)
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        StopSignal._active = None
