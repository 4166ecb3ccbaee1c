"""The global amax pass: per-program partial maxima of |x|, then ``torch.amax`` of those; the result stays
a device tensor the quantizing kernels load (no host sync)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import launch_options, to_fp32

AMAX_BLOCK = 8192


@triton.jit
def _abs_max_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = to_fp32(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    tl.store(partial_ptr + tl.program_id(0), tl.max(magnitude_bits, axis=0))


def abs_max_partials(x: torch.Tensor) -> torch.Tensor:
    """int32 [programs]: the FP32 bits of partial maxima of |x| (one a program of AMAX_BLOCK elements)."""
    n = x.numel()
    programs = triton.cdiv(n, AMAX_BLOCK)
    partial = torch.empty(programs, dtype=torch.int32, device=x.device)
    _abs_max_kernel[(programs,)](x, partial, n, BLOCK=AMAX_BLOCK, **launch_options(x))
    return partial


def abs_max(x: torch.Tensor) -> torch.Tensor:
    """0-d FP32 max|x| on x's device (NaN if any element is NaN), without a host sync."""
    return abs_max_partials(x).amax().view(torch.float32)
