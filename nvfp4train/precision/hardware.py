"""What this machine can run: the CUDA compute capability and whether Transformer Engine is installed."""

from __future__ import annotations

import importlib.util

import torch


def cuda_capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None
