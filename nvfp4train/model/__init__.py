"""The hybrid Mamba-2 / attention / MLP model family (Nemotron-H style).

from nvfp4train.model import build_model, flops_per_token
model = build_model({"pattern": "M-*-M-", "d_model": 128}, layer_factory=None)   # None: nn.Linear layers
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nvfp4train.lazy import lazy_names

from .config import ModelConfig
from .flops import flops_per_token

if TYPE_CHECKING:
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
    from .hybrid import HybridLM

    cfg = cfg_dict if isinstance(cfg_dict, ModelConfig) else ModelConfig.from_dict(cfg_dict)
    return HybridLM(cfg, layer_factory=layer_factory)


# The modules (torch's, the kernels') load on first use of their names: `nvfp4train.model.config`, which every
# command's config imports, then imports neither torch nor the model code.
_LAZY = {
    "HybridLM": "hybrid",
    "param_groups": "hybrid",
    "LINEAR_NAMES": "layers",
    "PLAIN_LAYERS": "layers",
    "LayerFactory": "layers",
    "linear_cross_entropy": "loss",
}


__getattr__ = lazy_names(__name__, _LAZY)
