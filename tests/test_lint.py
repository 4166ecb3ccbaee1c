"""The whole repository passes `ruff check` and `ruff format --check` with pyproject.toml's [tool.ruff] settings."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (it comes with the test extra: pip install -e '.[test]')",
)
def test_ruff_check_passes_repo_wide():
    # --no-cache: the check leaves no .ruff_cache in the checkout.
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"ruff check . failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (it comes with the test extra: pip install -e '.[test]')",
)
def test_ruff_format_leaves_the_repo_as_it_is():
    # [tool.ruff.format] in pyproject.toml: the Triton kernel modules are excluded (their long parameter lists)
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"ruff format --check . failed ({proc.returncode}): run `ruff format .`\n"
        f"{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    )
