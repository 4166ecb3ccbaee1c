"""RMSNorm and Mamba-2's gated RMSNorm as one Triton kernel each way, on CUDA.

The PyTorch norms in blocks.py cast to FP32, square, mean, rsqrt, multiply and cast back: five or six
kernels and as many round trips through memory per norm, forward and backward. mamba-ssm's
`layernorm_gated` kernels do it in one pass (FP32 inside, output in the input's dtype, the same
"gate before norm" grouping as GatedRMSNorm). They are wrapped as torch.library custom ops so that
torch.compile keeps the model in one graph. Used on CUDA when mamba-ssm's Triton modules import
(blocks.py); elsewhere the PyTorch versions run.
"""
from __future__ import annotations

import math

import torch

from .marks import assume_constant_result
from .ops import gated_norm_kernels


@assume_constant_result  # evaluated once when compiling, not traced
def fused_norm_available() -> bool:
    try:
        gated_norm_kernels()
        return True
    except ImportError:
        return False


@torch.library.custom_op("nvfp4train::rms_norm_triton", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, eps: float,
              group_size: int, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)  # the kernel rounds its FP32 result on the store
    out, _, rstd = gated_norm_kernels()._layer_norm_fwd(x, weight, None, eps, z=z, out=out, group_size=group_size,
                                              norm_before_gate=False, is_rms_norm=True)
    return out, rstd


# A tuple, not a list: autograd then hands the backward one gradient per output (dy, drstd); with a
# list output it got a single list and the backward failed on a GPU ("missing ... '_drstd'").
@_rms_norm.register_fake
def _(x, weight, z, eps, group_size, out_dtype):
    rstd = x.new_empty(x.shape[0] * (x.shape[1] // group_size), dtype=torch.float32)
    return torch.empty_like(x, dtype=out_dtype), rstd


@torch.library.custom_op("nvfp4train::rms_norm_triton_backward", mutates_args=())
def _rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None,
                       rstd: torch.Tensor, eps: float, group_size: int) -> list[torch.Tensor]:
    dx, dw, dz = rms_norm_backward(dy.contiguous(), x, weight, z, rstd, eps, group_size)
    return [dx, dw] if z is None else [dx, dw, dz]


# Warps each SM gets from the backward's grid. mamba-ssm's launcher (`_layer_norm_bwd`) starts one program
# of up to 8 warps per SM (about 4 warps per SM for the gated norm's groups), each walking its rows one
# after another: too few warps to hide the latency of a row's loads and reductions (what it cost:
# docs/results/code-measurements.md). Its kernel is launched here with more programs.
NORM_BWD_WARPS_PER_SM = 32


def row_block(width: int, element_size: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) of a kernel that holds one row of `width` elements: the next power of two, and
    mamba-ssm's launcher's warps for it."""
    block_n = 1 << max(width - 1, 0).bit_length()  # triton.next_power_of_2, without importing triton
    if block_n > 65536 // element_size:
        raise RuntimeError(f"fused RMSNorm: a row of {width} elements is over the kernel's 64 KB limit")
    return block_n, min(max(block_n // 256, 1), 8)


def backward_programs(
    rows: int, ngroups: int, num_warps: int, device: torch.device, warps_per_sm: int = NORM_BWD_WARPS_PER_SM
) -> tuple[int, int]:
    """(programs, rows a program) of a norm's backward: about `warps_per_sm` warps on each SM (4 SMs off the
    GPU: Triton's interpreter), each program walking its rows and writing one row of partial weight gradients."""
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    programs = max(1, min(rows, math.ceil(sm_count * max(1, warps_per_sm // num_warps) / ngroups)))
    rows_per_program = math.ceil(rows / programs)
    return math.ceil(rows / rows_per_program), rows_per_program


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None,
                      rstd: torch.Tensor, eps: float, group_size: int,
                      warps_per_sm: int = NORM_BWD_WARPS_PER_SM, dz: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dx, dweight, dz of RMSNorm(x [* silu(z)]) * weight with mamba-ssm's Triton kernel, its launcher's
    arguments but more programs (and so more partial weight-gradient rows, summed in FP32 at the end by
    partial_sums.py). ``dz``: where to write z's gradient ([M, N] with contiguous rows, any row stride: a slice of
    a larger gradient); default a new tensor."""
    M, N = x.shape
    ngroups = N // group_size
    block_n, num_warps = row_block(group_size, x.element_size())
    programs, rows_per_program = backward_programs(M, ngroups, num_warps, x.device, warps_per_sm)
    dx = torch.empty_like(x)
    if z is not None and dz is None:
        dz = torch.empty_like(z)
    dw_partial = torch.empty((programs, N), dtype=torch.float32, device=x.device)
    with torch.cuda.device(x.device.index):
        gated_norm_kernels()._layer_norm_bwd_kernel[(programs, ngroups)](
            x, weight, None, z, None, dy, dx, dw_partial, None, dz, None, rstd,
            x.stride(0), z.stride(0) if z is not None else 0, 0, dy.stride(0), dx.stride(0),
            dz.stride(0) if dz is not None else 0, dw_partial.stride(0), 0,
            M, group_size, eps, rows_per_program,
            BLOCK_N=block_n, NORM_BEFORE_GATE=False, IS_RMS_NORM=True, num_warps=num_warps)
    from .partial_sums import sum_partials  # triton: imported where the kernels run

    return dx, sum_partials(dw_partial, weight.dtype), dz


@_rms_norm_backward.register_fake
def _(dy, x, weight, z, rstd, eps, group_size):
    return [torch.empty_like(x), torch.empty_like(weight)] + ([] if z is None else [torch.empty_like(z)])


def _setup_context(ctx, inputs, output):
    x, weight, z, eps, group_size, _ = inputs
    ctx.save_for_backward(x, weight, z, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.eps, ctx.group_size = eps, group_size


def _backward(ctx, dy, _drstd):
    x, weight, z, rstd = ctx.saved_tensors
    grads = _rms_norm_backward(dy, x, weight, z, rstd, ctx.eps, ctx.group_size)
    return grads[0], grads[1], grads[2] if z is not None else None, None, None, None


_rms_norm.register_autograd(_backward, setup_context=_setup_context)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor | None = None,
                   group_size: int | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm(x) * weight, or with z: RMSNorm(x * silu(z)) * weight over groups of group_size channels.
    FP32 inside; returns `out_dtype`, default x's (as blocks.RMSNorm and blocks.GatedRMSNorm). dx has
    x's dtype whatever the output's (the backward reads dy in its own dtype)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    # The kernels take z's row stride: the Mamba mixer's z, a slice of in_proj's output, is read where it lies
    # (a contiguous copy of it was a pass over [tokens, d_inner] per layer, and another tensor saved).
    z2 = _rows_contiguous(z.reshape(-1, shape[-1])) if z is not None else None
    out, _ = _rms_norm(x2, weight.contiguous(), z2, eps, group_size or shape[-1], out_dtype or x.dtype)
    return out.reshape(shape)


__all__ = ["fused_norm_available", "fused_rms_norm"]
