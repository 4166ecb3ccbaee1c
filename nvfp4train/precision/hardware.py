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


def te_nvfp4_recipe_fields() -> frozenset[str]:
    """The fields of the installed Transformer Engine's NVFP4BlockScaling recipe (empty without TE or that
    recipe): newer TE versions add the 4over6, row-scaling and backward-override fields."""
    try:
        from transformer_engine.common.recipe import NVFP4BlockScaling
    except (ImportError, OSError, RuntimeError):  # not installed, or its libraries do not load here
        return frozenset()
    return frozenset(getattr(NVFP4BlockScaling, "__dataclass_fields__", ()))
