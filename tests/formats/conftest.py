"""Shared fixtures for tests/formats: the TE golden vectors and device selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

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


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
