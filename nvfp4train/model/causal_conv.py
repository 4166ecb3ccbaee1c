"""Mamba-2's depthwise causal conv1d + SiLU as Triton kernels, forward and backward, on CUDA.

Without causal-conv1d's CUDA extension (not installable on the GPU machines: it needs a build against
their torch) the mixer ran `F.conv1d` on a transposed, padded copy of its `xBC` slice, then SiLU and a
transpose back; cuDNN's depthwise weight gradient is slow, and the copies cost a pass each. Here the
kernels read `xBC` [b, T, channels] where it lies (a strided slice of in_proj's output), compute each
output in FP32 with the FP32 weight and bias (as causal-conv1d's kernel does), apply SiLU once and
write [b, T, channels] in x's dtype. The backward recomputes the pre-activation (nothing but x is saved),
writes dx and per-tile partial sums of the weight and bias gradients (summed in FP32 afterwards).

Numerics: the reference (`ssd.causal_conv1d_silu`'s PyTorch path) rounds the convolution to x's dtype
before SiLU, the kernels do not; results agree to that rounding (tests/model/test_causal_conv.py, on
CPU through Triton's interpreter and on a GPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .partial_sums import sum_partials

BLOCK_T, BLOCK_C = 32, 64
# the K = 4 kernels: a program walks ROWS4 positions of BLOCK_C4 channels with WARPS4 warps
ROWS4, BLOCK_C4, WARPS4 = 64, 256, 2


@triton.jit
def _load_x(x_ptr, b, ts, c, T, C, stride_b, stride_t):
    mask = ((ts >= 0) & (ts < T))[:, None] & (c < C)[None, :]
    return tl.load(x_ptr + b * stride_b + ts[:, None].to(tl.int64) * stride_t + c[None, :], mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _conv_silu_fwd_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, T, C, stride_b, stride_t, K: tl.constexpr,
                          BT: tl.constexpr, BC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    cmask = c < C
    z = tl.zeros((BT, BC), tl.float32) + tl.load(bias_ptr + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    for k in tl.static_range(K):  # y[t] = silu(bias + sum_k w[k] x[t - (K - 1) + k])
        w = tl.load(w_ptr + c * K + k, mask=cmask, other=0.0).to(tl.float32)
        z += _load_x(x_ptr, b, t - (K - 1) + k, c, T, C, stride_b, stride_t) * w[None, :]
    y = z * tl.sigmoid(z)
    mask = (t < T)[:, None] & cmask[None, :]
    tl.store(y_ptr + b * T * C + t[:, None].to(tl.int64) * C + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _conv_silu_bwd_kernel(x_ptr, w_ptr, bias_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, T, C, stride_b, stride_t,
                          dx_stride_b, dx_stride_t, n_t, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """dx[t] = sum_m w[K-1-m] dz[t+m], dz = dy * silu'(z); this tile's sums of dz * x[t-(K-1)+k] (dw)
    and of dz (dbias) into row (b, tile) of the partial buffers."""
    b = tl.program_id(0).to(tl.int64)
    pid_t = tl.program_id(1)
    t = pid_t * BT + tl.arange(0, BT)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    cmask = c < C
    bias = tl.load(bias_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    dx = tl.zeros((BT, BC), tl.float32)
    row = (b * n_t + pid_t) * C + c
    for m in tl.static_range(K):  # dz at t + m, recomputing z there
        s = t + m
        z = tl.zeros((BT, BC), tl.float32) + bias[None, :]
        for j in tl.static_range(K):
            w = tl.load(w_ptr + c * K + j, mask=cmask, other=0.0).to(tl.float32)
            z += _load_x(x_ptr, b, s - (K - 1) + j, c, T, C, stride_b, stride_t) * w[None, :]
        dmask = (s < T)[:, None] & cmask[None, :]
        dy = tl.load(dy_ptr + b * T * C + s[:, None].to(tl.int64) * C + c[None, :], mask=dmask,
                     other=0.0).to(tl.float32)
        sg = tl.sigmoid(z)
        dz = dy * sg * (1.0 + z * (1.0 - sg))
        w_m = tl.load(w_ptr + c * K + (K - 1 - m), mask=cmask, other=0.0).to(tl.float32)
        dx += dz * w_m[None, :]
        if m == 0:
            for k in tl.static_range(K):
                xk = _load_x(x_ptr, b, t - (K - 1) + k, c, T, C, stride_b, stride_t)
                tl.store(dw_ptr + row * K + k, tl.sum(dz * xk, axis=0), mask=cmask)
            tl.store(db_ptr + row, tl.sum(dz, axis=0), mask=cmask)
    mask = (t < T)[:, None] & cmask[None, :]
    tl.store(dx_ptr + b * dx_stride_b + t[:, None].to(tl.int64) * dx_stride_t + c[None, :],
             dx.to(dx_ptr.dtype.element_ty), mask=mask)


# K = 4 (every Mamba preset): each program owns BC channels of ROWS consecutive positions and walks down
# the sequence a row at a time, keeping the last three rows of x (and, backward, of dz) in registers. Each x
# and dy element is loaded once (plus a 3-row halo per program), z and silu'(z) are computed once per
# position instead of once per tap, and the weight and bias gradients are sums in the thread that owns
# the channel: no cross-thread reductions. Same sums in the same order as the tile kernels above.
@triton.jit
def _load_row(ptr, s, c, T, C, stride_t):
    return tl.load(ptr + s.to(tl.int64) * stride_t + c, mask=(c < C) & (s >= 0) & (s < T), other=0.0).to(tl.float32)


@triton.jit
def _sigmoid(z, FAST: tl.constexpr):
    """FAST (CUDA): ex2.approx.ftz and an approximate reciprocal, four instructions where tl.sigmoid's
    denormal-safe exp and division take eleven; a few ulp of FP32 either way. Triton's interpreter has no
    libdevice, so it runs tl.sigmoid."""
    if FAST:
        return libdevice.fast_dividef(1.0, 1.0 + libdevice.fast_expf(-z))
    else:
        return tl.sigmoid(z)


@triton.jit
def _conv4_prologue(x_ptr, w_ptr, bias_ptr, t0, c, T, C, stride_t):
    """The channels' four taps and bias (FP32), and x[t0-3], x[t0-2], x[t0-1]: the window before row t0."""
    cmask = c < C
    w0 = tl.load(w_ptr + c * 4 + 0, mask=cmask, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + c * 4 + 1, mask=cmask, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + c * 4 + 2, mask=cmask, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + c * 4 + 3, mask=cmask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    return (w0, w1, w2, w3, bias, _load_row(x_ptr, t0 - 3, c, T, C, stride_t),
            _load_row(x_ptr, t0 - 2, c, T, C, stride_t), _load_row(x_ptr, t0 - 1, c, T, C, stride_t))


@triton.jit
def _conv4_silu_fwd_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, T, C, stride_b, stride_t, ROWS: tl.constexpr,
                           BC: tl.constexpr, FAST: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t0 = tl.program_id(1) * ROWS
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    cmask = c < C
    x_ptr += b * stride_b
    y_ptr += b * T * C
    w0, w1, w2, w3, bias, x_3, x_2, x_1 = _conv4_prologue(x_ptr, w_ptr, bias_ptr, t0, c, T, C, stride_t)
    for i in range(ROWS):
        s = t0 + i
        x0 = _load_row(x_ptr, s, c, T, C, stride_t)
        z = bias + x_3 * w0 + x_2 * w1 + x_1 * w2 + x0 * w3
        y = z * _sigmoid(z, FAST)
        tl.store(y_ptr + s.to(tl.int64) * C + c, y.to(y_ptr.dtype.element_ty), mask=cmask & (s < T))
        x_3, x_2, x_1 = x_2, x_1, x0


@triton.jit
def _conv4_silu_bwd_kernel(x_ptr, w_ptr, bias_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, T, C, stride_b, stride_t,
                           dx_stride_b, dx_stride_t, n_t, ROWS: tl.constexpr, BC: tl.constexpr, FAST: tl.constexpr):
    """dz[s] = dy[s] silu'(z[s]) for s in the program's rows and 3 past them; dx[s-3] = dz[s-3] w3 + dz[s-2] w2
    + dz[s-1] w1 + dz[s] w0 once dz[s] is known; the weight and bias gradient sums over the program's rows."""
    b = tl.program_id(0).to(tl.int64)
    pid_t = tl.program_id(1)
    t0 = pid_t * ROWS
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    cmask = c < C
    x_ptr += b * stride_b
    dy_ptr += b * T * C
    dx_ptr += b * dx_stride_b
    w0, w1, w2, w3, bias, x_3, x_2, x_1 = _conv4_prologue(x_ptr, w_ptr, bias_ptr, t0, c, T, C, stride_t)
    dz_3 = tl.zeros((BC,), tl.float32)  # dz[s-3], dz[s-2], dz[s-1]: rows before t0 are never stored
    dz_2 = tl.zeros((BC,), tl.float32)
    dz_1 = tl.zeros((BC,), tl.float32)
    dw0 = tl.zeros((BC,), tl.float32)
    dw1 = tl.zeros((BC,), tl.float32)
    dw2 = tl.zeros((BC,), tl.float32)
    dw3 = tl.zeros((BC,), tl.float32)
    db = tl.zeros((BC,), tl.float32)
    for i in range(ROWS + 3):  # dx of the program's last row needs dz 3 rows further
        s = t0 + i
        x0 = _load_row(x_ptr, s, c, T, C, stride_t)
        dy = _load_row(dy_ptr, s, c, T, C, C)
        z = bias + x_3 * w0 + x_2 * w1 + x_1 * w2 + x0 * w3
        sg = _sigmoid(z, FAST)
        dz = dy * sg * (1.0 + z * (1.0 - sg))  # zero past T (dy masked there)
        own = i < ROWS  # the halo rows past the program's own feed dx only
        dzo = tl.where(own, dz, 0.0)
        dw0 += dzo * x_3
        dw1 += dzo * x_2
        dw2 += dzo * x_1
        dw3 += dzo * x0
        db += dzo
        dx = tl.zeros((BC,), tl.float32) + dz_3 * w3 + dz_2 * w2 + dz_1 * w1 + dz * w0
        tl.store(dx_ptr + (s - 3).to(tl.int64) * dx_stride_t + c, dx.to(dx_ptr.dtype.element_ty),
                 mask=cmask & (i >= 3) & (s - 3 < T))
        x_3, x_2, x_1 = x_2, x_1, x0
        dz_3, dz_2, dz_1 = dz_2, dz_1, dz
    row = (b * n_t + pid_t) * C + c
    tl.store(dw_ptr + row * 4 + 0, dw0, mask=cmask)
    tl.store(dw_ptr + row * 4 + 1, dw1, mask=cmask)
    tl.store(dw_ptr + row * 4 + 2, dw2, mask=cmask)
    tl.store(dw_ptr + row * 4 + 3, dw3, mask=cmask)
    tl.store(db_ptr + row, db, mask=cmask)


def _launch_options(x: torch.Tensor, warps: int = 4) -> dict:
    return {"num_warps": warps} if x.is_cuda else {}


def _channels_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(2) == 1 else x.contiguous()


def conv_silu_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(depthwise causal conv(x)) of x [b, T, C] (read in place when its channels are contiguous),
    weight [C, 1, K], bias [C]."""
    x = _channels_contiguous(x)
    b, T, C = x.shape
    K = weight.shape[-1]
    y = torch.empty((b, T, C), dtype=x.dtype, device=x.device)
    args = (x, weight.contiguous(), bias.contiguous(), y, T, C, x.stride(0), x.stride(1))
    if K == 4:
        _conv4_silu_fwd_kernel[(b, triton.cdiv(T, ROWS4), triton.cdiv(C, BLOCK_C4))](
            *args, ROWS=ROWS4, BC=BLOCK_C4, FAST=x.is_cuda, **_launch_options(x, WARPS4))
    else:
        _conv_silu_fwd_kernel[(b, triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))](
            *args, K=K, BT=BLOCK_T, BC=BLOCK_C, **_launch_options(x))
    return y


def conv_silu_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       dx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) of conv_silu_forward. ``dx``: where to write x's gradient, [b, T, C] with its channels
    contiguous (a slice of a larger gradient); default a new tensor."""
    x = _channels_contiguous(x)
    b, T, C = x.shape
    K = weight.shape[-1]
    rows = ROWS4 if K == 4 else BLOCK_T  # sequence positions one program covers
    n_t = triton.cdiv(T, rows)
    if dx is None:
        dx = torch.empty((b, T, C), dtype=x.dtype, device=x.device)
    elif dx.shape != x.shape or dx.stride(2) != 1:
        raise ValueError(f"conv_silu_backward: dx must be {tuple(x.shape)} with contiguous channels, got "
                         f"{tuple(dx.shape)} strides {dx.stride()}")
    dw = torch.empty((b * n_t, C, K), dtype=torch.float32, device=x.device)
    db = torch.empty((b * n_t, C), dtype=torch.float32, device=x.device)
    args = (x, weight.contiguous(), bias.contiguous(), dy.contiguous(), dx, dw, db, T, C, x.stride(0), x.stride(1),
            dx.stride(0), dx.stride(1), n_t)
    if K == 4:
        _conv4_silu_bwd_kernel[(b, n_t, triton.cdiv(C, BLOCK_C4))](*args, ROWS=ROWS4, BC=BLOCK_C4, FAST=x.is_cuda,
                                                                   **_launch_options(x, WARPS4))
    else:
        _conv_silu_bwd_kernel[(b, n_t, triton.cdiv(C, BLOCK_C))](*args, K=K, BT=BLOCK_T, BC=BLOCK_C,
                                                                 **_launch_options(x))
    return dx, sum_partials(dw, weight.dtype).reshape(weight.shape), sum_partials(db, bias.dtype)


# As a torch.library custom op (fake + autograd registrations), so torch.compile keeps the mixer in one
# graph; the outputs are new and contiguous.
@torch.library.custom_op("nvfp4train::causal_conv1d_silu_triton", mutates_args=())
def causal_conv1d_silu_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return conv_silu_forward(x, weight, bias)


@causal_conv1d_silu_triton.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape)


@torch.library.custom_op("nvfp4train::causal_conv1d_silu_triton_backward", mutates_args=())
def _causal_conv1d_silu_triton_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                        bias: torch.Tensor) -> list[torch.Tensor]:
    return list(conv_silu_backward(dy, x, weight, bias))


@_causal_conv1d_silu_triton_backward.register_fake
def _(dy, x, weight, bias):
    return [x.new_empty(x.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)]


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    return tuple(_causal_conv1d_silu_triton_backward(dy, *ctx.saved_tensors))


causal_conv1d_silu_triton.register_autograd(_backward, setup_context=_setup_context)
