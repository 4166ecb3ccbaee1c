"""The column sums of per-program partial gradients, [programs, n] FP32 -> [n], in one Triton pass.

The Triton backward kernels of the fused norms (fused_norm.py: the weight gradient) and of the causal
conv (causal_conv.py: weight and bias) write one FP32 row of partial sums per program, to be added up
afterwards. `partial.sum(0)` is a reduction over the outer dimension, which torch runs as one short
kernel per call with few threads in flight, one per norm and conv in a step (what they cost:
docs/results/code-measurements.md). Here each program owns a strip of
SUM_COLS columns and walks the rows SUM_ROWS at a time; the order of the additions is fixed, so the
sums repeat bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SUM_ROWS, SUM_COLS, SUM_WARPS = 128, 32, 4  # rows per load, columns per program (128 B of FP32 a row)


@triton.jit
def _sum_rows_kernel(
    partial_ptr, out_ptr, n_rows, n_cols, ROW_BLOCKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    # ROW_BLOCKS = cdiv(n_rows, BLOCK_R): a compile-time trip count (triton 3.6's interpreter cannot loop to a
    # run-time bound); a few values per model, one compilation each.
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for i in range(ROW_BLOCKS):
        r = i * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = (r < n_rows)[:, None] & (c < n_cols)[None, :]
        acc += tl.load(partial_ptr + r[:, None].to(tl.int64) * n_cols + c[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + c, tl.sum(acc, axis=0), mask=c < n_cols)


def sum_partials(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """partial [programs, ...] FP32 summed over its first dimension, in `dtype`, shape partial.shape[1:]."""
    partial = partial.contiguous()
    n_rows = partial.shape[0]
    n_cols = partial.numel() // max(n_rows, 1)
    out = torch.empty(partial.shape[1:], dtype=torch.float32, device=partial.device)
    options = {"num_warps": SUM_WARPS} if partial.is_cuda else {}
    _sum_rows_kernel[(triton.cdiv(n_cols, SUM_COLS),)](
        partial,
        out,
        n_rows,
        n_cols,
        ROW_BLOCKS=triton.cdiv(n_rows, SUM_ROWS),
        BLOCK_R=SUM_ROWS,
        BLOCK_C=SUM_COLS,
        **options,
    )
    return out.to(dtype)  # a no-op for the FP32 master weights training keeps


__all__ = ["sum_partials"]
