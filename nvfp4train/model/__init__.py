"""The hybrid Mamba-2 / attention / MLP model family (Nemotron-H style).

from nvfp4train.model import build_model, flops_per_token
model = build_model({"pattern": "M-*-M-", "d_model": 128}, linear_factory=None)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .blocks import LinearFactory
from .config import ModelConfig
from .flops import flops_per_token
from .hybrid import HybridLM, param_groups
from .loss import linear_cross_entropy

__all__ = ["ModelConfig", "HybridLM", "param_groups", "flops_per_token", "build_model", "linear_cross_entropy"]


def build_model(cfg_dict: Mapping[str, Any] | ModelConfig, linear_factory: LinearFactory | None = None) -> HybridLM:
    """Validate a config mapping (unknown keys and bad values raise ValueError) and build the model."""
    cfg = cfg_dict if isinstance(cfg_dict, ModelConfig) else ModelConfig.from_dict(cfg_dict)
    return HybridLM(cfg, linear_factory=linear_factory)
