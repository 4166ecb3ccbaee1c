"""The hybrid Mamba-2 / attention / MLP model family (Nemotron-H style).

from nvfp4train.model import build_model, flops_per_token
model = build_model({"pattern": "M-*-M-", "d_model": 128}, layer_factory=None)   # None: nn.Linear layers
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import ModelConfig
from .flops import flops_per_token
from .hybrid import HybridLM, param_groups
from .layers import LINEAR_NAMES, PLAIN_LAYERS, LayerFactory
from .loss import linear_cross_entropy

__all__ = [
    "ModelConfig",
    "HybridLM",
    "param_groups",
    "flops_per_token",
    "build_model",
    "linear_cross_entropy",
    "LayerFactory",
    "LINEAR_NAMES",
    "PLAIN_LAYERS",
]


def build_model(cfg_dict: Mapping[str, Any] | ModelConfig, layer_factory: LayerFactory | None = None) -> HybridLM:
    """Validate a config mapping (unknown keys and bad values raise ValueError) and build the model."""
    cfg = cfg_dict if isinstance(cfg_dict, ModelConfig) else ModelConfig.from_dict(cfg_dict)
    return HybridLM(cfg, layer_factory=layer_factory)
