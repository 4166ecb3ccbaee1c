"""nvfp4train.launch.processes: a launched job ends whole. torchrun starts each worker in a session of its own
(so killpg of the launcher misses them, and they train on without it); a launcher of that shape stands in
for it here, a real one in tests/gpu/test_distributed_gpu.py."""

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nvfp4train.launch.processes import descendants, kill_tree, run_and_kill_on_timeout


def launcher(tag: str = "") -> str:
    """A launcher that starts its worker as torchrun does (start_new_session=True) and says the worker's pid;
    `tag` marks the worker's command line."""
    return (
        "import subprocess, sys, time\n"
        f"worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {tag}'], "
        "start_new_session=True)\n"
        "print(worker.pid, flush=True)\n"
        "time.sleep(600)\n"
    )


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_kill_tree_ends_workers_in_their_own_sessions():
    proc = subprocess.Popen([sys.executable, "-c", launcher()], stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    assert worker in descendants(proc.pid) and not _gone(worker)
    kill_tree(proc)
    proc.stdout.close()
    assert proc.returncode == -9 and _gone(worker)


def test_a_timeout_ends_the_job_whole():
    tag, t0 = f"worker-{uuid.uuid4().hex}", time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_and_kill_on_timeout([sys.executable, "-c", launcher(tag)], timeout=3)
    assert time.monotonic() - t0 < 60
    stray = subprocess.run(["pgrep", "-f", f"# {tag}"], capture_output=True, text=True)
    assert stray.stdout.strip() == "", stray.stdout  # the worker went with its launcher


def test_a_finished_command_gives_its_output():
    script = "import sys; print('out'); print('err', file=sys.stderr)"
    done = run_and_kill_on_timeout([sys.executable, "-c", script], timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")


def test_it_takes_subprocess_runs_arguments():
    """The suite's launcher commands run through it as through subprocess.run: the output so far on a timeout,
    input, check, capture_output=False."""
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_and_kill_on_timeout([sys.executable, "-c", launcher()], timeout=3)
    assert int(timed_out.value.stdout)  # the worker's pid, printed before the timeout
    echoed = run_and_kill_on_timeout([sys.executable, "-c", "print(input()[::-1])"], timeout=60, input="abc\n")
    assert echoed.stdout == "cba\n"
    with pytest.raises(subprocess.CalledProcessError):
        run_and_kill_on_timeout([sys.executable, "-c", "raise SystemExit(3)"], timeout=60, check=True)
    uncaptured = run_and_kill_on_timeout([sys.executable, "-c", "pass"], timeout=60, capture_output=False)
    assert (uncaptured.returncode, uncaptured.stdout) == (0, None)


def test_a_timeout_returns_though_a_process_that_left_the_job_holds_its_pipes():
    """A process re-parented away from the job (a daemon its worker started, say) is out of kill_tree's
    reach and may hold the job's stdout: the timeout still returns, with the output so far."""
    tag = f"orphan-{uuid.uuid4().hex}"
    daemon = (
        "import os, subprocess, sys, time\n"
        "if os.fork() == 0:\n"  # the middle process exits at once: its child is re-parented, out of the job
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {tag}'])\n"
        "    os._exit(0)\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    t0 = time.monotonic()
    try:
        with pytest.raises(subprocess.TimeoutExpired) as timed_out:
            run_and_kill_on_timeout([sys.executable, "-c", daemon], timeout=3)
        assert time.monotonic() - t0 < 40 and "started" in timed_out.value.stdout
    finally:
        subprocess.run(["pkill", "-f", f"# {tag}"])
