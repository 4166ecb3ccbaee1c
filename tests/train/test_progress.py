"""The progress bar falls back to plain lines whenever it cannot draw: a terminal without a size (a pty
that reports 0x0 columns, as some job consoles do) used to show nothing between start and `done:`."""

import os
import pty
import re
import subprocess
import sys

from tests.conftest import REPO, cli_env

SCRIPT = """
from nvfp4train.train.metrics import ProgressBar
bar = ProgressBar("{setting}", enabled=True, total=4, initial=0, log_every=2)
for step in range(1, 5):
    bar.update(step, 5.0, 1000.0)
bar.close()
"""


def _run_on_sizeless_tty(setting: str) -> str:
    primary, secondary = pty.openpty()  # a fresh pty has no size (0 rows, 0 columns)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT.format(setting=setting)],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=secondary,
            text=True,
            timeout=120,
        )
    finally:
        os.close(secondary)
        os.close(primary)
    assert proc.returncode == 0
    return proc.stdout


def test_sizeless_terminal_gets_plain_lines():
    for setting in ("auto", "true"):
        lines = _run_on_sizeless_tty(setting).splitlines()
        assert len(lines) == 2, lines
        # a log (nohup, SLURM) shows how far the run is and how long it has left, as the bar would
        assert re.fullmatch(r"step 2 loss 5\.0000 1,000 tok/s \| 50% \(2/4\), ETA \d+s", lines[0]), lines
        assert re.fullmatch(r"step 4 loss 5\.0000 1,000 tok/s \| 100% \(4/4\), ETA 0s", lines[1]), lines
