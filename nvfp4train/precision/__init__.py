"""Precision policies and quantized linear layers.

    from nvfp4train.precision import PrecisionPolicy, build_linear_factory, PrecisionController
    policy = PrecisionPolicy.from_dict(section)               # a mapping, validated (RunConfig parses its own)
    factory = build_linear_factory(policy, n_blocks, seed)    # the model's layer factory (model.layers)
    ctl = PrecisionController(policy, model)                  # schedule, telemetry, checkpoint state
    weights_changed(model)                                    # after editing weights by hand (a new weight epoch)
    peak = gemm_peak_kind(policy, ctl.backend_name)           # "bf16" | "fp8" | "fp4": MFU's peak

Imports `nvfp4train.formats`, and from the model only the protocol it implements and the linear names it takes
(`model.layers`); Transformer Engine is imported lazily by the `te` backend (`backends/te.py`).
"""

from typing import TYPE_CHECKING

from nvfp4train.lazy import lazy_names

if TYPE_CHECKING:
    from .backends import gemm_peak_kind
    from .controller import PrecisionController, PrecisionLayers, build_linear_factory, quant_linears, weights_changed
    from .linear import QuantLinear, WeightEpoch
    from .memory import saved_activation_bytes, saved_bytes_report
    from .recipe import ROLES, LayerRecipe, OperandSpec, PrecisionPolicy, SwitchConfig

# Each name's module is imported on first use: the policy (`recipe`, which every run's config holds) without
# torch, the layers and backends with it.
_LAZY = {
    "gemm_peak_kind": "backends",
    **dict.fromkeys(
        ("PrecisionController", "PrecisionLayers", "build_linear_factory", "quant_linears", "weights_changed"),
        "controller",
    ),
    "QuantLinear": "linear",
    "WeightEpoch": "linear",
    "saved_activation_bytes": "memory",
    "saved_bytes_report": "memory",
    **dict.fromkeys(("ROLES", "LayerRecipe", "OperandSpec", "PrecisionPolicy", "SwitchConfig"), "recipe"),
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "PrecisionPolicy",
    "build_linear_factory",
    "PrecisionLayers",
    "quant_linears",
    "PrecisionController",
    "QuantLinear",
    "WeightEpoch",
    "weights_changed",
    "LayerRecipe",
    "OperandSpec",
    "SwitchConfig",
    "ROLES",
    "saved_activation_bytes",
    "saved_bytes_report",
    "gemm_peak_kind",
]
