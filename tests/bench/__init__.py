"""Tests of benchmarks/: each benchmark runs on CPU as a user runs it (``python -m benchmarks.<name>``)."""

from __future__ import annotations

import subprocess
import sys

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env


def run_benchmark(name: str, *args) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> --device cpu *args`` from the repository root."""
    return run_and_kill_on_timeout(
        [sys.executable, "-m", f"benchmarks.{name}", "--device", "cpu", *map(str, args)],
        cwd=REPO,
        env=cli_env(),
        timeout=600,
    )
