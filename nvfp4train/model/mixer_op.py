"""The Mamba mixer's conv, scan and gated norm as one custom op on CUDA, between in_proj and out_proj.

in_proj's output zxbcdt [b, T, d_inner + conv channels + heads] is read as three slices (z, xBC, dt) by three
layers: the conv, the scan and the gated norm. As separate autograd nodes, their backwards return three
gradients and autograd concatenates them into zxbcdt's, a pass over the widest activation of the layer
(its cost: docs/results/code-measurements.md). Here one backward allocates that gradient once
and each kernel writes its slice: the norm's dz, the scan's ddt (mamba-ssm takes the buffers to write into,
as its own `mamba_split_conv1d_scan_combined` does) and the conv's dxBC. The kernels and their order are the
ones the separate layers run (`causal_conv.py`, mamba-ssm's `_mamba_chunk_scan_combined_fwd/_bwd`,
`fused_norm.py`), so the output is the same and the gradients the same up to mamba-ssm's atomic adds.

Used by `blocks.Mamba2Mixer` where all three run their Triton kernels (`mixer_op_available`); elsewhere the
mixer keeps the separate layers. out_proj stays outside: a quantized linear must see its input.
"""

from __future__ import annotations

import torch

from .fused_norm import fused_norm_available
from .ops import (
    backward_cumsums_allowed,
    causal_conv1d_kernel_available,
    chunk_scan_backward,
    chunk_scan_forward,
    gated_norm_kernels,
    load_triton_ssd,
    match_triton_determinism,
)
from .ssd import conv_backend, resolved_ssd_backend, triton_conv_available, unpack_xbc


def mixer_op_applies(is_cuda: bool, ssd_backend: str) -> bool:
    """Whether the mixer's conv, scan and norm would each run their Triton kernels (the conv's, mamba-ssm's
    scan and norm): then `mamba_conv_scan_norm` runs them as one op."""
    if not (is_cuda and fused_norm_available()):
        return False
    deterministic = torch.are_deterministic_algorithms_enabled()
    conv = conv_backend(True, deterministic, causal_conv1d_kernel_available(), triton_conv_available())
    return conv == "triton" and resolved_ssd_backend(True, ssd_backend) == "triton"


def _split(zxbcdt: torch.Tensor, d_inner: int, conv_dim: int):
    heads = zxbcdt.shape[-1] - d_inner - conv_dim
    return torch.split(zxbcdt, [d_inner, conv_dim, heads], dim=-1)


@torch.library.custom_op("nvfp4train::mamba_conv_scan_norm", mutates_args=())
def mamba_conv_scan_norm(
    zxbcdt: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    d_inner: int,
    head_dim: int,
    groups: int,
    norm_group: int,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [b, T, d_inner] in zxbcdt's dtype: the gated norm's output, out_proj's input; then what the backward
    reads: the conv's output [b, T, conv channels], the scan's output [b, T, heads, head_dim], the norm's rstd)."""
    from .causal_conv import conv_silu_forward

    load_triton_ssd()
    match_triton_determinism()
    b, T, _ = zxbcdt.shape
    z, xbc, dt = _split(zxbcdt, d_inner, conv_weight.shape[0])
    xbc_post = conv_silu_forward(xbc, conv_weight, conv_bias)
    x, B, C = unpack_xbc(xbc_post, dt.shape[-1], head_dim, groups)
    y = chunk_scan_forward(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True)[0].contiguous()
    out = torch.empty((b, T, d_inner), dtype=zxbcdt.dtype, device=zxbcdt.device)
    _, _, rstd = gated_norm_kernels()._layer_norm_fwd(
        y.view(b * T, d_inner),
        norm_weight.contiguous(),
        None,
        eps,
        z=z.view(b * T, d_inner),
        out=out.view(b * T, d_inner),
        group_size=norm_group,
        norm_before_gate=False,
        is_rms_norm=True,
    )
    return out, xbc_post, y, rstd


@mamba_conv_scan_norm.register_fake
def _(
    zxbcdt, conv_weight, conv_bias, A, D, dt_bias, norm_weight, eps, d_inner, head_dim, groups, norm_group, chunk_size
):
    b, T, width = zxbcdt.shape
    conv_dim = conv_weight.shape[0]
    heads = width - d_inner - conv_dim
    return (
        zxbcdt.new_empty((b, T, d_inner)),
        zxbcdt.new_empty((b, T, conv_dim)),
        zxbcdt.new_empty((b, T, heads, head_dim)),
        zxbcdt.new_empty((b * T * (d_inner // norm_group),), dtype=torch.float32),
    )


@torch.library.custom_op("nvfp4train::mamba_conv_scan_norm_backward", mutates_args=())
def _mamba_conv_scan_norm_backward(
    dout: torch.Tensor,
    zxbcdt: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    xbc_post: torch.Tensor,
    y: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    d_inner: int,
    head_dim: int,
    groups: int,
    norm_group: int,
    chunk_size: int,
) -> list[torch.Tensor]:
    from .causal_conv import conv_silu_backward
    from .fused_norm import rms_norm_backward

    match_triton_determinism()
    b, T, _ = zxbcdt.shape
    conv_dim = conv_weight.shape[0]
    z, xbc, dt = _split(zxbcdt, d_inner, conv_dim)
    dzxbcdt = torch.empty(zxbcdt.shape, dtype=zxbcdt.dtype, device=zxbcdt.device)
    dz, dxbc, ddt = _split(dzxbcdt, d_inner, conv_dim)
    dy, dnorm_weight, _ = rms_norm_backward(
        dout.reshape(b * T, d_inner).contiguous(),
        y.view(b * T, d_inner),
        norm_weight.contiguous(),
        z.view(b * T, d_inner),
        rstd,
        eps,
        norm_group,
        dz=dz.view(b * T, d_inner),
    )
    dxbc_post = torch.empty_like(xbc_post)
    x, B, C = unpack_xbc(xbc_post, dt.shape[-1], head_dim, groups)
    dx, dB, dC = unpack_xbc(dxbc_post, dt.shape[-1], head_dim, groups)
    with backward_cumsums_allowed():
        _, _, dA, _, _, dD, _, ddt_bias, _ = chunk_scan_backward(
            dy.view(y.shape),
            x,
            dt,
            A,
            B,
            C,
            y,
            chunk_size,
            D=D,
            dt_bias=dt_bias,
            dt_softplus=True,
            dx=dx,
            ddt=ddt,
            dB=dB,
            dC=dC,
        )
    _, dconv_weight, dconv_bias = conv_silu_backward(dxbc_post, xbc, conv_weight, conv_bias, dx=dxbc)
    return [dzxbcdt, dconv_weight, dconv_bias] + [g.contiguous() for g in (dA, dD, ddt_bias)] + [dnorm_weight]


@_mamba_conv_scan_norm_backward.register_fake
def _(
    dout,
    zxbcdt,
    conv_weight,
    conv_bias,
    A,
    D,
    dt_bias,
    norm_weight,
    xbc_post,
    y,
    rstd,
    eps,
    d_inner,
    head_dim,
    groups,
    norm_group,
    chunk_size,
):
    return [zxbcdt.new_empty(zxbcdt.shape)] + [
        t.new_empty(t.shape) for t in (conv_weight, conv_bias, A, D, dt_bias, norm_weight)
    ]


def _setup_context(ctx, inputs, output):
    zxbcdt, conv_weight, conv_bias, A, D, dt_bias, norm_weight, *args = inputs
    _, xbc_post, y, rstd = output
    ctx.mark_non_differentiable(xbc_post, y, rstd)
    ctx.save_for_backward(zxbcdt, conv_weight, conv_bias, A, D, dt_bias, norm_weight, xbc_post, y, rstd)
    ctx.args = args


def _backward(ctx, dout, _dxbc_post, _dy, _drstd):
    grads = _mamba_conv_scan_norm_backward(dout, *ctx.saved_tensors, *ctx.args)
    return (*grads, *([None] * len(ctx.args)))


mamba_conv_scan_norm.register_autograd(_backward, setup_context=_setup_context)
