"""RMSNorm and Mamba-2's gated RMSNorm as one Triton kernel each way, on CUDA.

The PyTorch norms in blocks.py cast to FP32, square, mean, rsqrt, multiply and cast back: five or six
kernels and as many round trips through memory per norm, forward and backward. mamba-ssm's
`layernorm_gated` kernels do it in one pass (FP32 inside, output in the input's dtype, the same
"gate before norm" grouping as GatedRMSNorm). They are wrapped as torch.library custom ops so that
torch.compile keeps the model in one graph. Used on CUDA when mamba-ssm's Triton modules import
(blocks.py); elsewhere the PyTorch versions run.
"""
from __future__ import annotations

from typing import Optional

import torch

from .ssd import import_mamba_triton

_KERNELS = None


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = import_mamba_triton("layernorm_gated")
    return _KERNELS


@torch.compiler.assume_constant_result  # evaluated once when compiling, not traced
def fused_norm_available() -> bool:
    try:
        _kernels()
        return True
    except ImportError:
        return False


@torch.library.custom_op("nvfp4train::rms_norm_triton", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, z: Optional[torch.Tensor], eps: float,
              group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    out, _, rstd = _kernels()._layer_norm_fwd(x, weight, None, eps, z=z, group_size=group_size,
                                              norm_before_gate=False, is_rms_norm=True)
    return out, rstd


# A tuple, not a list: autograd then hands the backward one gradient per output (dy, drstd); with a
# list output it got a single list and the backward failed on a GPU ("missing ... '_drstd'").
@_rms_norm.register_fake
def _(x, weight, z, eps, group_size):
    return torch.empty_like(x), x.new_empty(x.shape[0] * (x.shape[1] // group_size), dtype=torch.float32)


@torch.library.custom_op("nvfp4train::rms_norm_triton_backward", mutates_args=())
def _rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, z: Optional[torch.Tensor],
                       rstd: torch.Tensor, eps: float, group_size: int) -> list[torch.Tensor]:
    dx, dw, _, dz = _kernels()._layer_norm_bwd(dy.contiguous(), x, weight, None, eps, None, rstd, z, group_size,
                                               False, True)
    return [dx, dw] if z is None else [dx, dw, dz]


@_rms_norm_backward.register_fake
def _(dy, x, weight, z, rstd, eps, group_size):
    return [torch.empty_like(x), torch.empty_like(weight)] + ([] if z is None else [torch.empty_like(z)])


def _setup_context(ctx, inputs, output):
    x, weight, z, eps, group_size = inputs
    ctx.save_for_backward(x, weight, z, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.eps, ctx.group_size = eps, group_size


def _backward(ctx, dy, _drstd):
    x, weight, z, rstd = ctx.saved_tensors
    grads = _rms_norm_backward(dy, x, weight, z, rstd, ctx.eps, ctx.group_size)
    return grads[0], grads[1], grads[2] if z is not None else None, None, None


_rms_norm.register_autograd(_backward, setup_context=_setup_context)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, z: Optional[torch.Tensor] = None,
                   group_size: Optional[int] = None) -> torch.Tensor:
    """RMSNorm(x) * weight, or with z: RMSNorm(x * silu(z)) * weight over groups of group_size channels.
    FP32 inside; returns x's dtype (as blocks.RMSNorm and blocks.GatedRMSNorm)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    z2 = z.reshape(-1, shape[-1]).contiguous() if z is not None else None
    out, _ = _rms_norm(x2, weight.contiguous(), z2, eps, group_size or shape[-1])
    return out.reshape(shape)


__all__ = ["fused_norm_available", "fused_rms_norm"]
