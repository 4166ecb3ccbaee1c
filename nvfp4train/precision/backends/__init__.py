"""The GEMM backends, one object each: EMULATED | SCALED_MM | TE, and choosing one (`auto`).

* EMULATED  (any device): `code x block scale` in BF16, FP32-accumulating GEMM, global scales in
            the epilogue. Implements every policy knob. The reference the others are checked against.
* SCALED_MM (FP8 policies on CUDA: per tensor on sm_89+, blockwise on sm_90): the same quantized
            operands, multiplied on FP8 tensor cores by `torch._scaled_mm`; numerically equivalent
            to emulated up to summation order (tests/gpu/test_precision_gpu.py checks it).
* TE        (Transformer Engine installed, and the GPU runs the recipe): the policy maps to a TE
            recipe (Float8BlockScaling / Float8CurrentScaling on sm_89+/sm_90, NVFP4BlockScaling
            on sm_100+); see te.py. Only policies TE can express exactly are accepted.

EMULATED and SCALED_MM run `QuantLinear` and do its GEMMs (`backend.gemm`); TE builds its own
module (`te.TELinear`). `auto` prefers te, then scaled_mm, then emulated, taking the first
that can run this policy faithfully here, and says why. `gemm_peak_kind` says which tensor-core
peak the chosen backend's GEMMs run at (for MFU).

One module each: `emulated.py`, `scaled_mm.py` (with the K padding its GEMMs want), `cublas.py` (the emulated
GEMM's device-scaled cuBLAS call), `te.py` (TE's recipes and `TELinear`); `base.py` is the common class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvfp4train.config.schema import ConfigError

from ..operands import operand_format
from ..recipe import PrecisionPolicy
from .base import Backend
from .emulated import EmulatedBackend, gemm_fp32, scale_and_cast
from .scaled_mm import TILE_K_MULTIPLE, ScaledMMBackend, gemm_k_multiple, gemm_out_width, pad_fp8_k
from .te import TEBackend, TELinear

EMULATED, SCALED_MM, TE = EmulatedBackend(), ScaledMMBackend(), TEBackend()
BACKENDS: dict[str, Backend] = {b.name: b for b in (EMULATED, SCALED_MM, TE)}


def get_backend(backend: Backend | str) -> Backend:
    """The backend object of a name (objects pass through)."""
    if isinstance(backend, Backend):
        return backend
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {sorted(BACKENDS)}")
    return BACKENDS[backend]


def resolve_backend(policy: PrecisionPolicy) -> tuple[Backend, str]:
    """(backend, reason): one backend for every linear, so it must run the policy and each precision.modules
    preset that quantizes. Raises ConfigError (a ValueError) when an explicitly requested backend cannot run."""
    requested = policy.backend
    quantized = {"": policy} if policy.format != "bf16" else {}
    quantized.update({p: m for p, m in policy.module_policies().items() if m.format != "bf16"})
    if not quantized:
        # Every linear is plain F.linear: nothing to choose.
        return EMULATED, "format bf16 runs torch's own linear (F.linear) under autocast"

    def why_not(backend: Backend) -> str | None:
        for pattern, p in quantized.items():
            why = backend.unsupported(p)
            if why:
                return f"{why} (precision.modules.{pattern}: {p.name or p.format})" if pattern else why
        return None

    if requested != "auto":
        backend = BACKENDS[requested]
        why = why_not(backend)
        if why:
            raise ConfigError(
                f"precision.backend={str(requested)!r} cannot run here: {why}. Use backend: emulated or auto"
            )
        return backend, "requested"
    formats = ", ".join(dict.fromkeys(str(p.format) for p in quantized.values()))
    reasons = []
    for backend in (TE, SCALED_MM):
        why = why_not(backend)
        if why is None:
            return backend, f"auto: {backend.name} runs {formats} here"
        reasons.append(f"not {backend.name}: {why}")
    return EMULATED, "auto: " + "; ".join(reasons)


def gemm_peak_kind(precision: PrecisionPolicy | Mapping[str, Any], backend: Backend | str) -> str:
    """The tensor-core peak ("bf16" | "fp8" | "fp4") the linear layers' GEMMs run at under
    `backend`, for MFU: emulated formats run BF16 GEMMs; a native backend runs at the rate of
    the format its Fprop operands are in (FP8 on scaled_mm / TE FP8, FP4 on TE NVFP4)."""
    policy = precision if isinstance(precision, PrecisionPolicy) else PrecisionPolicy.from_dict(precision)
    if not get_backend(backend).native_gemm:
        return "bf16"
    return operand_format(policy.quantized_recipe().fprop_x).gemm_peak


__all__ = [
    "BACKENDS",
    "EMULATED",
    "SCALED_MM",
    "TE",
    "TILE_K_MULTIPLE",
    "Backend",
    "EmulatedBackend",
    "ScaledMMBackend",
    "TEBackend",
    "TELinear",
    "gemm_fp32",
    "gemm_k_multiple",
    "gemm_out_width",
    "gemm_peak_kind",
    "get_backend",
    "pad_fp8_k",
    "resolve_backend",
    "scale_and_cast",
]
