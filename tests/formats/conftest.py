"""Shared fixtures for tests/formats: the TE golden vectors and device selection."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
GOLDEN_SUBDIR = Path("golden") / "te_nvfp4_reference"


def shared_dir_candidates() -> list[Path]:
    """Where ``shared/`` may live: $NVFP4TRAIN_SHARED, <repo>/../shared (CI), /work/shared."""
    candidates = []
    if os.environ.get("NVFP4TRAIN_SHARED"):
        candidates.append(Path(os.environ["NVFP4TRAIN_SHARED"]))
    candidates += [REPO.parent / "shared", Path("/work/shared")]
    return candidates


def golden_dir() -> Path | None:
    for shared in shared_dir_candidates():
        if (shared / GOLDEN_SUBDIR / "manifest.json").is_file():
            return shared / GOLDEN_SUBDIR
    return None


def load_golden():
    """(manifest dict, tensors dict) or pytest.skip naming the places searched."""
    directory = golden_dir()
    if directory is None:
        searched = ", ".join(str(p / GOLDEN_SUBDIR) for p in shared_dir_candidates())
        pytest.skip(f"TE golden vectors not found (searched: {searched}); set NVFP4TRAIN_SHARED")
    from safetensors.torch import load_file

    manifest = json.loads((directory / "manifest.json").read_text())
    return manifest, load_file(str(directory / "cases.safetensors"))


@pytest.fixture(scope="session")
def golden():
    return load_golden()


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
