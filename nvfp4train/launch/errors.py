"""A run's refusal as one line, from one rank, with a non-zero exit: also under torchrun and srun.

Every rank checks the same config and data, so every rank refuses the same way; printing it from each
would repeat the line N times. Rank 0 prints it. Every rank launched by torchrun also writes it to the
error file torchrun names in TORCHELASTIC_ERROR_FILE, the way torchrun's `@record` would write a
traceback: torchrun's failure summary then shows the line instead of "To enable traceback see: ...", and
`python -m nvfp4train.launch` (torchrun with a one-line failure, launch/torchrun.py) prints it as the only line.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Set by nvfp4train.launch for the processes it starts: it prints the failing rank's line itself.
LAUNCHER_PRINTS = "NVFP4TRAIN_LAUNCHER_PRINTS_ERRORS"


def launch_rank() -> int:
    """This process's rank as its launcher set it (torchrun's RANK, srun's SLURM_PROCID), before any
    process group exists; 0 for a single process."""
    for key in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def write_error_file(line: str) -> bool:
    """`line` as the failure message torchrun reads from this rank's error file; False without one."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    try:
        with open(path, "w") as f:
            json.dump({"message": line, "timestamp": int(time.time())}, f)
    except OSError:
        return False
    return True


def report(line: str, *, to_stderr: bool | None = None) -> None:
    """Show `line` once for the whole job: rank 0 prints it (unless our launcher prints it), every
    torchrun rank records it in its error file."""
    recorded = write_error_file(line)
    if to_stderr is None:
        to_stderr = launch_rank() == 0 and not (recorded and os.environ.get(LAUNCHER_PRINTS) == "1")
    if to_stderr:
        print(line, file=sys.stderr, flush=True)


def fail(message: str, exit_code: int) -> None:
    """`error: <message>` reported once (see `report`), then exit with `exit_code`."""
    report(f"error: {' '.join(str(message).split())}")
    sys.exit(exit_code)
