"""BF16 matrix products on a CPU without BF16 matrix instructions, at FP32 GEMM speed.

PyTorch multiplies BF16 matrices on a CPU with oneDNN where the CPU has BF16 instructions (AVX512-BF16, AMX).
Elsewhere (AVX2-only CPUs: many AMD EPYC and Ryzen, older Intel) it falls back to a scalar loop several times
slower than its FP32 GEMM (docs/results/code-measurements.md has the numbers). On such a
CPU, `cpu_bf16_matmuls()` runs every BF16 mm, addmm, bmm and baddbmm as the FP32 GEMM of the same values, rounded
to BF16 once. That is what a BF16 GEMM computes: the product of two BF16 values is exact in FP32, both
accumulate in FP32 and round the result once; only the order of the FP32 sums may differ, as it does between any
two BLAS libraries. Elsewhere, and on GPUs, the context does nothing.

It is a dispatch mode, below autograd and autocast: it sees the BF16 operands autocast made, and the backward's
products too when `backward()` runs inside it."""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
MATMULS = frozenset({_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default})


@functools.cache
def cpu_has_bf16_gemm() -> bool:
    """Whether PyTorch multiplies BF16 matrices with this CPU's own BF16 instructions (oneDNN). A build without
    oneDNN's check (another architecture) keeps PyTorch's own BF16 GEMM: counted as having them."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


class FP32GemmForBF16(TorchDispatchMode):
    """BF16 mm/addmm/bmm/baddbmm on CPU tensors as FP32 GEMMs of the same values, the result rounded to BF16."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMULS and _bf16_cpu(args[0]):
            wide = [a.float() if _bf16_cpu(a) else a for a in args]
            return func(*wide, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def _bf16_cpu(a) -> bool:
    return isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 and a.device.type == "cpu"


def cpu_bf16_matmuls(device: torch.device | str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """FP32 GEMMs for BF16 products on a CPU device without BF16 instructions; otherwise nothing. `enabled`:
    whether the code inside computes in BF16 at all (with FP32 compute the mode would only add host time)."""
    if not enabled or torch.device(device).type != "cpu" or cpu_has_bf16_gemm():
        return contextlib.nullcontext()
    return FP32GemmForBF16()
