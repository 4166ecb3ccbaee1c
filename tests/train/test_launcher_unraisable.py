"""The launcher drops one exception at exit, torch's rendezvous keep-alive timer's finalizer joining its own
(daemon) thread, and prints every other unraisable exception as before."""

from __future__ import annotations

import sys
import threading
import types

from nvfp4train.launch import torchrun


def _unraisable(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the exception an unraisable hook would get
        return types.SimpleNamespace(exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__, object=None)
    raise AssertionError("expected an exception")


def test_the_rendezvous_timers_self_join_is_dropped_and_others_are_printed(monkeypatch):
    from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer

    printed = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    torchrun._quiet_rendezvous_timer_stop()
    self_join = _unraisable(lambda: _PeriodicTimer._stop_thread(threading.current_thread(), threading.Event()))
    assert isinstance(self_join.exc_value, RuntimeError)  # "cannot join current thread"
    sys.unraisablehook(self_join)
    other = _unraisable(lambda: 1 / 0)
    sys.unraisablehook(other)
    assert printed == [other]
