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

BLOCK_T, BLOCK_C = 32, 64


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
                          n_t, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
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
    tl.store(dx_ptr + b * T * C + t[:, None].to(tl.int64) * C + c[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=mask)


def _launch_options(x: torch.Tensor) -> dict:
    return {"num_warps": 4} if x.is_cuda else {}


def _channels_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(2) == 1 else x.contiguous()


def conv_silu_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(depthwise causal conv(x)) of x [b, T, C] (read in place when its channels are contiguous),
    weight [C, 1, K], bias [C]."""
    x = _channels_contiguous(x)
    b, T, C = x.shape
    K = weight.shape[-1]
    y = torch.empty((b, T, C), dtype=x.dtype, device=x.device)
    grid = (b, triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))
    _conv_silu_fwd_kernel[grid](x, weight.contiguous(), bias.contiguous(), y, T, C, x.stride(0), x.stride(1), K=K,
                                BT=BLOCK_T, BC=BLOCK_C, **_launch_options(x))
    return y


def conv_silu_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = _channels_contiguous(x)
    b, T, C = x.shape
    K = weight.shape[-1]
    n_t = triton.cdiv(T, BLOCK_T)
    dx = torch.empty((b, T, C), dtype=x.dtype, device=x.device)
    dw = torch.empty((b * n_t, C, K), dtype=torch.float32, device=x.device)
    db = torch.empty((b * n_t, C), dtype=torch.float32, device=x.device)
    grid = (b, n_t, triton.cdiv(C, BLOCK_C))
    _conv_silu_bwd_kernel[grid](x, weight.contiguous(), bias.contiguous(), dy.contiguous(), dx, dw, db, T, C,
                                x.stride(0), x.stride(1), n_t, K=K, BT=BLOCK_T, BC=BLOCK_C, **_launch_options(x))
    return dx, dw.sum(0).reshape(weight.shape).to(weight.dtype), db.sum(0).to(bias.dtype)


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
