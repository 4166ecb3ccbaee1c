"""The GEMM backends, one object each: EMULATED | SCALED_MM | TE, and choosing one (`auto`).

* EMULATED  (any device): `code x block scale` in BF16, FP32-accumulating GEMM, global scales in
            the epilogue. Implements every policy knob. The reference the others are checked against.
* SCALED_MM (FP8 per-tensor policies on CUDA sm_89+): the same quantized operands, multiplied on
            FP8 tensor cores by `torch._scaled_mm`; numerically equivalent to emulated up to
            summation order (scripts/check_precision_gpu.py checks it).
* TE        (Transformer Engine installed, and the GPU runs the recipe): the policy maps to a TE
            recipe (Float8BlockScaling / Float8CurrentScaling on sm_89+/sm_90, NVFP4BlockScaling
            on sm_100+); see te_backend.py. Only policies TE can express exactly are accepted.

EMULATED and SCALED_MM run `QuantLinear` and do its GEMMs (`backend.gemm`); TE builds its own
module (`te_backend.TELinear`). `auto` prefers te, then scaled_mm, then emulated, taking the first
that can run this policy faithfully here, and says why. `gemm_peak_kind` says which tensor-core
peak the chosen backend's GEMMs run at (for MFU).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from nvfp4train.schema import ConfigError

from . import te_backend
from .hardware import cuda_capability
from .operands import Quantized, operand_format, pad2d, round_up
from .policy import PrecisionPolicy


def gemm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [N, K]ᵀ with exact products and FP32 accumulation.

    The operand values are exact in BF16, so a BF16 tensor-core GEMM with an FP32 output is exact
    up to summation order; on CPU (and if that overload is missing) an FP32 GEMM is, too."""
    if a.is_cuda and a.dtype == b.dtype == torch.bfloat16:
        try:
            return torch.mm(a, b.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            pass
    return a.float() @ b.float().t()


class Backend:
    """`name`; `native_gemm`: whether its GEMMs run at the operand format's own tensor-core rate
    (False: BF16 GEMMs on dequantized operands); `unsupported(policy)`: why it cannot run
    `policy` here (None: it can)."""
    name: str
    native_gemm: bool

    def unsupported(self, policy: PrecisionPolicy) -> str | None:
        raise NotImplementedError


class EmulatedBackend(Backend):
    name, native_gemm = "emulated", False

    def unsupported(self, policy):
        return None

    def gemm(self, a: Quantized, b: Quantized) -> torch.Tensor:
        """FP32 result of (a.values · b.valuesᵀ) · a.decode_scale · b.decode_scale."""
        out = gemm_fp32(a.values, b.values)
        if a.decode_scale is not None:
            out = out * a.decode_scale
        if b.decode_scale is not None:
            out = out * b.decode_scale
        return out


class ScaledMMBackend(EmulatedBackend):
    """Per-tensor FP8 GEMMs on FP8 tensor cores; any other operand pair as EMULATED does it."""
    name, native_gemm = "scaled_mm", True

    def unsupported(self, policy):
        if policy.format != "fp8_tensorwise":
            return (f"scaled_mm runs the fp8_tensorwise policy only (format={str(policy.format)!r}: blockwise FP8 "
                    "scale layouts of torch._scaled_mm are not wired up; NVFP4/MXFP4 GEMMs need sm_100)")
        cap = cuda_capability()
        if cap is None:
            return "scaled_mm needs a CUDA GPU (torch.cuda.is_available() is False)"
        if cap < (8, 9):
            return f"scaled_mm needs FP8 tensor cores (sm_89+); this GPU is sm_{cap[0]}{cap[1]}"
        return None

    def gemm(self, a: Quantized, b: Quantized) -> torch.Tensor:
        if a.fp8_data is None or b.fp8_data is None:
            return super().gemm(a, b)
        # torch._scaled_mm with FP32 output; cuBLASLt wants K and N multiples of 16 and b
        # column-major: pad with zeros.
        da, db = a.fp8_data, b.fp8_data
        k = round_up(da.shape[1], 16)
        n = db.shape[0]
        da = pad2d(da.view(torch.uint8), da.shape[0], k).view(da.dtype)
        db = pad2d(db.view(torch.uint8), round_up(n, 16), k).view(db.dtype)
        out = torch._scaled_mm(da, db.t(), scale_a=a.decode_scale.reshape(()).float(),
                               scale_b=b.decode_scale.reshape(()).float(), out_dtype=torch.float32)
        return out[:, :n]


class TEBackend(Backend):
    name, native_gemm = "te", True

    def unsupported(self, policy):
        return te_backend.unsupported(policy)


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
    """(backend, reason). Raises ConfigError (a ValueError) when an explicitly requested backend cannot run."""
    requested = policy.backend
    if policy.format == "bf16":
        # Every linear is plain F.linear: nothing to choose.
        return EMULATED, "format bf16 runs torch's own linear (F.linear) under autocast"
    if requested != "auto":
        backend = BACKENDS[requested]
        why = backend.unsupported(policy)
        if why:
            raise ConfigError(f"precision.backend={str(requested)!r} cannot run here: {why}. Use backend: emulated or auto")
        return backend, "requested"
    reasons = []
    for backend in (TE, SCALED_MM):
        why = backend.unsupported(policy)
        if why is None:
            return backend, f"auto: {backend.name} runs {policy.format} here"
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
