"""EMULATED (any device): `code x block scale` in BF16, an FP32-accumulating GEMM, the operands' global
scales in the epilogue. Implements every policy knob; the reference the other backends are checked against.
On CUDA the scales go into cuBLAS's own epilogue (`cublas.py`), else one Triton pass or PyTorch applies them."""

from __future__ import annotations

import torch

from nvfp4train.formats.impl import triton_available

from ..operands import Quantized
from . import cublas
from .base import Backend


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


def scale_and_cast(
    out: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """The emulated GEMM's epilogue: ((out * a) * b).to(dtype) for the FP32 product `out` and the
    operands' 0-d FP32 global decode scales (None: none). On CUDA one Triton pass (the same roundings)
    instead of two FP32 multiplies and a cast over the whole output."""
    if (
        out.is_cuda
        and out.dtype == torch.float32
        and out.is_contiguous()
        and (a is not None or b is not None or dtype != torch.float32)
    ):
        if triton_available() and not torch.compiler.is_compiling():
            from nvfp4train.formats import kernels  # imports triton: only where it runs

            return kernels.dequant.scale_and_cast(out, a, b, dtype)
    if a is not None:
        out = out * a
    if b is not None:
        out = out * b
    return out.to(dtype)


class EmulatedBackend(Backend):
    name, native_gemm = "emulated", False

    def unsupported(self, policy):
        return None

    def gemm(self, a: Quantized, b: Quantized, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(a.values · b.valuesᵀ) in FP32, times a.decode_scale, times b.decode_scale (each product
        rounded in FP32), rounded once to `out_dtype`. On CUDA cuBLAS applies the scales in its epilogue
        (cublas.py: alpha = a × b read on the device) and writes `out_dtype` once."""
        av, bv = a.values, b.values
        if any(s is not None and s.ndim > 0 for s in (a.decode_scale, b.decode_scale)):
            # a row-scaled operand's [rows, 1] scales (TE's row scaling): the epilogues take 0-d scales
            out = gemm_fp32(av, bv)
            for scale in (a.decode_scale, b.decode_scale):
                if scale is not None:
                    out = out * (scale if scale.ndim == 0 or scale is a.decode_scale else scale.reshape(1, -1))
            return out.to(out_dtype)
        if cublas.supports(av, bv, out_dtype):
            alpha = None  # the product of the scales there are (None: no scale)
            for scale in (a.decode_scale, b.decode_scale):
                if scale is not None:
                    alpha = scale if alpha is None else alpha * scale
            return cublas.scaled_gemm(av, bv, alpha, out_dtype)
        return scale_and_cast(gemm_fp32(av, bv), a.decode_scale, b.decode_scale, out_dtype)
