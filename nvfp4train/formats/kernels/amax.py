"""The global amax pass: per-program partial maxima of |x|, then ``torch.amax`` of those; the result stays
a device tensor the quantizing kernels load (no host sync)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import PROLOGUE_CODES, apply_prologue, hw_bf16, launch_options, to_fp32

AMAX_BLOCK = 8192


@triton.jit
def _abs_max_kernel(x_ptr, a_ptr, partial_ptr, n, BLOCK: tl.constexpr, PROLOGUE: tl.constexpr = 0,
                    HW_BF16: tl.constexpr = False):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if PROLOGUE == 2:
        x = apply_prologue(x, tl.load(a_ptr + offs, mask=offs < n, other=0.0), PROLOGUE, HW_BF16)
    else:
        x = apply_prologue(x, x, PROLOGUE, HW_BF16)
    x = to_fp32(x)
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    tl.store(partial_ptr + tl.program_id(0), tl.max(magnitude_bits, axis=0))


def abs_max_partials(x: torch.Tensor, prologue: str | None = None, act_input: torch.Tensor | None = None):
    """int32 [programs]: the FP32 bits of partial maxima of |x| (one a program of AMAX_BLOCK elements); with a
    prologue, of |activation.apply(prologue, x, act_input)| (x and act_input bf16, contiguous)."""
    n = x.numel()
    programs = triton.cdiv(n, AMAX_BLOCK)
    partial = torch.empty(programs, dtype=torch.int32, device=x.device)
    _abs_max_kernel[(programs,)](
        x, x if act_input is None else act_input, partial, n, BLOCK=AMAX_BLOCK, PROLOGUE=PROLOGUE_CODES[prologue],
        HW_BF16=prologue is not None and hw_bf16(x), **launch_options(x),
    )
    return partial


def abs_max(x: torch.Tensor, prologue: str | None = None, act_input: torch.Tensor | None = None) -> torch.Tensor:
    """0-d FP32 max|x| (of the prologue's output: `abs_max_partials`) on x's device (NaN if any element is NaN),
    without a host sync."""
    return abs_max_partials(x, prologue, act_input).amax().view(torch.float32)
