"""The suite's subprocess helper: a timeout ends the command's whole process tree, so a hung rank fails
its test instead of hanging the suite."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_process

# a parent that starts a child holding the same stdout pipe, as torchrun's ranks do, and both sleep
TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; print(\"child\", flush=True); time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_timeout_kills_the_grandchildren_holding_the_pipes():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_process([sys.executable, "-c", TREE], capture_output=True, text=True, timeout=3)
    assert time.monotonic() - start < 30  # subprocess.run would wait on the child's pipe for its 600 s
    child_pid = int(caught.value.stdout.split()[0])
    for _ in range(50):  # killed by the group's SIGKILL (a zombie until someone reaps it)
        if not _running(child_pid):
            break
        time.sleep(0.1)
    assert not _running(child_pid)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_it_returns_what_subprocess_run_returns():
    proc = run_process(
        [sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (3, "out\n")
    with pytest.raises(subprocess.CalledProcessError):
        run_process([sys.executable, "-c", "raise SystemExit(1)"], capture_output=True, timeout=60, check=True)
