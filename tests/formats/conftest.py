"""Shared fixtures for tests/formats: the TE golden vectors and device selection."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def kernel_test(fn):
    """A check of the Triton kernels: runs in the interpreter subprocess, or on a GPU (marked gpu)."""
    if INTERPRETING:
        return fn
    marks = (pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))
    return functools.reduce(lambda f, mark: mark(f), marks, fn)


def rerun_in_triton_interpreter(test_file: str, timeout: float) -> str:
    """Run one test file again in a subprocess with TRITON_INTERPRET=1 (its Triton kernels on the CPU); returns
    pytest's last output line after asserting the run passed. One process: not the -n of a parallel outer run
    (.ci/run's PYTEST_ADDOPTS), which would only add workers."""
    root = Path(__file__).resolve().parents[2]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        # numpy warns of a division by a zero amax in the interpreter (the kernels handle it)
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning"]
        + [str(Path(test_file).resolve().relative_to(root))],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]


# Committed with the tests (provenance and licence in its README.md). A missing file is an error,
# never a skip: the bit-exactness tests must run in every clone and in CI.
GOLDEN_DIR = Path(__file__).resolve().parent / "golden" / "te_nvfp4_reference"


def golden_manifest() -> dict:
    return json.loads((GOLDEN_DIR / "manifest.json").read_text())


def load_golden():
    """(manifest dict, tensors dict) of the TE golden vectors."""
    from safetensors.torch import load_file

    return golden_manifest(), load_file(str(GOLDEN_DIR / "cases.safetensors"))


@pytest.fixture(scope="session")
def golden():
    return load_golden()


# TE's newer options (4over6, the 256 scale bound, row-scaled NVFP4), from the same TE commit.
GOLDEN_4OVER6_DIR = GOLDEN_DIR.parent / "te_nvfp4_4over6"


def golden_4over6_manifest() -> dict:
    return json.loads((GOLDEN_4OVER6_DIR / "manifest.json").read_text())


@pytest.fixture(scope="session")
def golden_4over6():
    """(manifest dict, tensors dict) of the 4over6 / row-scaled golden vectors."""
    from safetensors.torch import load_file

    return golden_4over6_manifest(), load_file(str(GOLDEN_4OVER6_DIR / "cases.safetensors"))


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
