"""Choosing the GEMM backend: emulated | scaled_mm | te, and `auto`.

* emulated  (any device): `code x block scale` in BF16, FP32-accumulating GEMM, global scales in
            the epilogue. Implements every policy knob. The reference the others are checked against.
* scaled_mm (FP8 per-tensor policies on CUDA sm_89+): the same quantized operands, multiplied on
            FP8 tensor cores by `torch._scaled_mm`; numerically equivalent to emulated up to
            summation order (scripts/check_precision_gpu.py checks it).
* te        (Transformer Engine installed, and the GPU runs the recipe): the policy maps to a TE
            recipe (Float8BlockScaling / Float8CurrentScaling on sm_89+/sm_90, NVFP4BlockScaling
            on sm_100+). Only policies TE can express exactly are accepted.

`auto` prefers te, then scaled_mm, then emulated, taking the first that can run this policy
faithfully here, and says why.
"""
from __future__ import annotations

import importlib.util

import torch

from .policy import PrecisionPolicy


def cuda_capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def scaled_mm_unsupported(policy: PrecisionPolicy) -> str | None:
    """Why `scaled_mm` cannot run this policy here (None: it can)."""
    if policy.format != "fp8_tensorwise":
        return (f"scaled_mm runs the fp8_tensorwise policy only (format={policy.format!r}: blockwise FP8 "
                "scale layouts of torch._scaled_mm are not wired up; NVFP4/MXFP4 GEMMs need sm_100)")
    cap = cuda_capability()
    if cap is None:
        return "scaled_mm needs a CUDA GPU (torch.cuda.is_available() is False)"
    if cap < (8, 9):
        return f"scaled_mm needs FP8 tensor cores (sm_89+); this GPU is sm_{cap[0]}{cap[1]}"
    return None


def te_unsupported(policy: PrecisionPolicy) -> str | None:
    """Why the `te` backend cannot run this policy here (None: it can)."""
    from . import te_backend  # small module; transformer_engine itself is imported lazily there

    return te_backend.unsupported(policy)


def resolve_backend(policy: PrecisionPolicy) -> tuple[str, str]:
    """(backend name, reason). Raises ValueError when an explicitly requested backend cannot run."""
    requested = policy.backend
    if policy.format == "bf16":
        # Every linear is plain F.linear: nothing to choose.
        return "emulated", "format bf16 runs torch's own linear (F.linear) under autocast"
    if requested == "emulated":
        return "emulated", "requested"
    if requested == "scaled_mm":
        why = scaled_mm_unsupported(policy)
        if why:
            raise ValueError(f"precision.backend='scaled_mm' cannot run here: {why}. Use backend: emulated or auto")
        return "scaled_mm", "requested"
    if requested == "te":
        why = te_unsupported(policy)
        if why:
            raise ValueError(f"precision.backend='te' cannot run here: {why}. Use backend: emulated or auto")
        return "te", "requested"
    # auto
    reasons = []
    for name, check in (("te", te_unsupported), ("scaled_mm", scaled_mm_unsupported)):
        why = check(policy)
        if why is None:
            return name, f"auto: {name} runs {policy.format} here"
        reasons.append(f"not {name}: {why}")
    return "emulated", "auto: " + "; ".join(reasons)
