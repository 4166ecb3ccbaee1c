"""The residual add and the next block's RMSNorm as one Triton kernel each way, on CUDA.

A block adds its mixer's output h to the residual stream x, and the next block's norm reads the sum:

    x' = x + h          y = RMSNorm(x') * weight

As two kernels the forward reads x and h, writes x', reads x' again and writes y; the backward runs the
norm's (dy -> dx') and then adds the gradient that reaches x' along the stream, and casts the sum to h's
dtype for the mixer's output linear. Here one kernel does each direction: forward x, h -> x', y; backward
dy, d(x')_stream -> dx (x's dtype), dh (h's dtype), per-program partial weight gradients (summed by
partial_sums.py). The sum is taken in FP32 and rounded to x's dtype before the norm reads it, as the
separate add does; the norm's arithmetic is the one fused_norm.py runs (mamba-ssm's kernel), so in an FP32
stream x + h, the norm's output and the weight gradient are the separate kernels' bits, and dx is within an
FP32 ulp of theirs: the compiler contracts the norm's last multiply and the add into one FMA, rounded once
(tests/model/test_residual_norm.py).

Used by `blocks.RMSNorm.add_and_norm` on CUDA where fused_norm.py's kernels run; elsewhere the add and the
norm run as PyTorch ops.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .fused_norm import backward_programs, row_block


@triton.jit
def _add_rms_norm_fwd_kernel(
    X, H, XOUT, Y, W, RSTD, stride_x, stride_h, stride_xout, stride_y, N, eps, BLOCK_N: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    # The stream's value is the sum rounded to its dtype; the norm reads that value, as it would from memory.
    xs = (x + h).to(XOUT.dtype.element_ty)
    tl.store(XOUT + row * stride_xout + cols, xs, mask=mask)
    x = xs.to(tl.float32)
    var = tl.sum(tl.where(mask, x * x, 0.0), axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    tl.store(Y + row * stride_y + cols, x * rstd * w, mask=mask)


@triton.jit
def _add_rms_norm_bwd_kernel(
    X,
    W,
    DY,
    DSTREAM,
    DX,
    DH,
    DW,
    RSTD,
    stride_x,
    stride_dy,
    stride_dstream,
    stride_dx,
    stride_dh,
    M,
    N,
    ROWS_PER_PROGRAM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = program * ROWS_PER_PROGRAM
    first = row_start.to(tl.int64)  # 64-bit offsets to the first row; the loop steps the pointers a row at a time
    X += first * stride_x
    DY += first * stride_dy
    DSTREAM += first * stride_dstream
    DX += first * stride_dx
    DH += first * stride_dh
    # A compile-time trip count (triton 3.6's interpreter cannot loop to a run-time bound); the last program's
    # rows past M are masked out.
    for i in range(ROWS_PER_PROGRAM):
        row = row_start + i
        m = mask & (row < M)
        x = tl.load(X + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + cols, mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row, mask=row < M, other=0.0)
        xhat = tl.where(m, x * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        dx = (wdy - xhat * c1) * rstd
        # The norm's dx rounded to the stream's dtype, as the separate norm kernel stores it, then the add.
        dx = dx.to(DX.dtype.element_ty).to(tl.float32)
        dx += tl.load(DSTREAM + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(DX + cols, dx, mask=m)
        tl.store(DH + cols, dx, mask=m)
        dw += dy * xhat
        X += stride_x
        DY += stride_dy
        DSTREAM += stride_dstream
        DX += stride_dx
        DH += stride_dh
    tl.store(DW + program * N + cols, dw, mask=mask)


def _on(device: torch.device):
    """Launch on the tensors' GPU (Triton launches on the current one); nothing to select on CPU (interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def add_rms_norm_forward(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, h [M, N] (rows contiguous) -> (x + h in x's dtype, RMSNorm(x + h) * weight in `out_dtype`, rstd [M])."""
    M, N = x.shape
    block_n, num_warps = row_block(N, x.element_size())
    stream = torch.empty_like(x)
    y = torch.empty((M, N), dtype=out_dtype, device=x.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    with _on(x.device):
        _add_rms_norm_fwd_kernel[(M,)](
            x, h, stream, y, weight, rstd, x.stride(0), h.stride(0), stream.stride(0), y.stride(0), N, eps,
            BLOCK_N=block_n, num_warps=num_warps,
        )  # fmt: skip
    return stream, y, rstd


def add_rms_norm_backward(
    dy: torch.Tensor, dstream: torch.Tensor, stream: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    h_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dx in the stream's dtype, dh in `h_dtype`, dweight): the norm's input gradient plus `dstream`, the
    gradient reaching x + h along the stream. The rows are split among programs as fused_norm.py's backward
    splits them, so the weight gradient's partial sums, and their sum, are the same."""
    from .partial_sums import sum_partials

    M, N = stream.shape
    block_n, num_warps = row_block(N, stream.element_size())
    programs, rows_per_program = backward_programs(M, 1, num_warps, stream.device)
    dx = torch.empty_like(stream)
    dh = torch.empty((M, N), dtype=h_dtype, device=stream.device)
    dw_partial = torch.empty((programs, N), dtype=torch.float32, device=stream.device)
    with _on(stream.device):
        _add_rms_norm_bwd_kernel[(programs,)](
            stream, weight, dy, dstream, dx, dh, dw_partial, rstd,
            stream.stride(0), dy.stride(0), dstream.stride(0), dx.stride(0), dh.stride(0),
            M, N, ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=block_n, num_warps=num_warps,
        )  # fmt: skip
    return dx, dh, sum_partials(dw_partial, weight.dtype)


@torch.library.custom_op("nvfp4train::add_rms_norm_triton", mutates_args=())
def _add_rms_norm(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return add_rms_norm_forward(x, h, weight, eps, out_dtype)


@_add_rms_norm.register_fake
def _(x, h, weight, eps, out_dtype):
    return torch.empty_like(x), torch.empty_like(x, dtype=out_dtype), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("nvfp4train::add_rms_norm_triton_backward", mutates_args=())
def _add_rms_norm_backward(
    dy: torch.Tensor, dstream: torch.Tensor, stream: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    h_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    return add_rms_norm_backward(dy, dstream, stream, weight, rstd, h_dtype)


@_add_rms_norm_backward.register_fake
def _(dy, dstream, stream, weight, rstd, h_dtype):
    return torch.empty_like(stream), torch.empty_like(stream, dtype=h_dtype), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    _, h, weight, _, _ = inputs
    stream, _, rstd = output
    ctx.save_for_backward(stream, weight, rstd)
    ctx.mark_non_differentiable(rstd)
    ctx.h_dtype = h.dtype


def _backward(ctx, dstream, dy, _drstd):
    stream, weight, rstd = ctx.saved_tensors
    dx, dh, dw = _add_rms_norm_backward(dy.contiguous(), dstream.contiguous(), stream, weight, rstd, ctx.h_dtype)
    return dx, dh, dw, None, None


_add_rms_norm.register_autograd(_backward, setup_context=_setup_context)


def fused_add_rms_norm(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h in x's dtype, RMSNorm(x + h) * weight in `out_dtype`), x and h of the same shape, normalized
    over the last dimension."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    h2 = h.reshape(-1, shape[-1]).contiguous()
    stream, y, _ = _add_rms_norm(x2, h2, weight.contiguous(), eps, out_dtype)
    return stream.view(shape), y.view(shape)


__all__ = ["fused_add_rms_norm"]
