"""The Mamba-2 SSD scan: a chunked pure-PyTorch reference, the step-by-step recurrence it must
equal, and mamba-ssm's Triton kernel for CUDA.

All of them compute, per head h (with B and C shared by the heads of one group):

    dt_t  = softplus(dt_raw_t + dt_bias)            (per token and head)
    S_t   = exp(dt_t * A) * S_{t-1} + dt_t * x_t B_t^T   (state: head_dim x d_state)
    y_t   = S_t C_t + D * x_t

Shapes (batch b, length T, heads h, head_dim p, groups g, state n):
    x [b,T,h,p]   dt_raw [b,T,h]   A [h] (negative)   B, C [b,T,g,n]   D [h]   dt_bias [h]
Output y [b,T,h,p] in x's dtype. The reference computes in float32 whatever the input dtype
(float64 for float64 inputs, which the tests use).

The chunked algorithm (Mamba-2 paper, "SSD"): split the sequence into chunks of Q tokens;
within a chunk the output is a masked (causal, decaying) attention-like product; across chunks
a small recurrence on the chunk-final states carries the past. Every contraction below is a
two-operand einsum that maps to one batched matmul, so `torch.utils.flop_counter` sees exactly
the FLOPs that `flops.py` predicts.

Deterministic mode (`torch.use_deterministic_algorithms(True)`, which `train.deterministic=true` sets):
"auto" runs mamba-ssm's Triton kernels in mamba-ssm's own deterministic mode (it reads torch's flag: its
backward writes per-program partial sums that are reduced in a fixed order, where it otherwise
accumulates with atomics), each of its autotuned kernels pinned to one configuration (`pin_triton_configs`):
autotuning by timing can pick different block sizes, so different summation orders, in two processes.
Without mamba-ssm the chunked PyTorch scan runs, with its cumulative sums as fixed-order log-step scans on
CUDA (torch's CUDA cumsum has no deterministic kernel and raises in that mode).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import ops
from .marks import assume_constant_result
from .ops import (
    backward_cumsums_allowed,
    causal_conv1d_kernel_available,
    chunk_scan_backward,
    chunk_scan_forward,
    load_triton_ssd,
    match_triton_determinism,
    triton_ssd_available,
    triton_ssd_deterministic_mode,
)


def deterministic_scan_needed(x: torch.Tensor) -> bool:
    """Whether cumulative sums of `x` must avoid torch.cumsum: a CUDA tensor in deterministic mode."""
    return x.is_cuda and torch.are_deterministic_algorithms_enabled()


def log_step_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive cumulative sum along `dim` by ceil(log2(n)) shifted adds (Hillis-Steele): every output is
    summed in the same order on every run, from element-wise kernels only (eager and compiled alike).
    Rounds differently from a sequential cumsum (a pairwise-like tree: no worse)."""
    dim = dim % x.dim()
    n, shift = x.shape[dim], 1
    while shift < n:
        shifted = x.narrow(dim, 0, n - shift)
        pad = [0, 0] * (x.dim() - 1 - dim) + [shift, 0]  # F.pad lists dims from the last one
        x = x + F.pad(shifted, pad)
        shift *= 2
    return x


def _cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return log_step_cumsum(x, dim) if deterministic_scan_needed(x) else x.cumsum(dim=dim)


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """a [..., L] -> [..., L, L] with out[i, j] = a[j+1] + ... + a[i] for i >= j, -inf above.

    Summed from a masked copy rather than as a difference of cumulative sums: cumsum(a)[i] -
    cumsum(a)[j] cancels catastrophically once the cumulative log-decay is large.
    """
    L = a.size(-1)
    ones = torch.ones(L, L, dtype=torch.bool, device=a.device)
    a_cols = a.unsqueeze(-1).expand(*a.shape, L)  # [..., k, j] = a[k]
    summed = _cumsum(a_cols.masked_fill(~ones.tril(-1), 0.0), dim=-2)  # sum over j < k <= i
    return summed.masked_fill(~ones.tril(0), -math.inf)


def ssd_chunked_torch(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """Chunked SSD in float32 (see module docstring). Any sequence length; pads to a chunk multiple."""
    out_dtype = x.dtype
    b, T, h, p = x.shape
    g, n = B.shape[-2:]
    r = h // g  # heads per group
    Q = min(chunk_size, T)
    n_chunks = -(-T // Q)
    pad = n_chunks * Q - T

    f32 = torch.promote_types(x.dtype, torch.float32)  # float64 stays float64 (for tests)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x32, B, C = x.to(f32), B.to(f32), C.to(f32)
        dt = F.softplus(dt.to(f32) + dt_bias.to(f32))  # [b,T,h]
        xdt = x32 * dt.unsqueeze(-1)  # discretized input
        log_decay = dt * A.to(f32)  # [b,T,h], <= 0
        if pad:
            # Zero padding at the end: dt = 0 there means no input and no decay, and the padded
            # outputs are dropped; earlier outputs never see later tokens.
            xdt = F.pad(xdt, (0, 0, 0, 0, 0, pad))
            log_decay = F.pad(log_decay, (0, 0, 0, pad))
            B = F.pad(B, (0, 0, 0, 0, 0, pad))
            C = F.pad(C, (0, 0, 0, 0, 0, pad))

        xdt = xdt.reshape(b, n_chunks, Q, g, r, p)
        B = B.reshape(b, n_chunks, Q, g, n)
        C = C.reshape(b, n_chunks, Q, g, n)
        a = log_decay.reshape(b, n_chunks, Q, g, r).permute(0, 1, 3, 4, 2)  # [b,c,g,r,Q]
        a_cum = _cumsum(a, dim=-1)

        # 1. Within each chunk: y_l = sum_{s <= l} (C_l . B_s) exp(a_cum_l - a_cum_s) xdt_s.
        CB = torch.einsum("bclgn,bcsgn->bcgls", C, B)  # shared by the r heads of a group
        scores = CB.unsqueeze(3) * torch.exp(_segsum(a))  # [b,c,g,r,Q,Q], causal mask inside
        y = torch.einsum("bcgrls,bcsgrp->bclgrp", scores, xdt)

        if n_chunks > 1:  # with a single chunk there is no past state to carry
            # 2. Each chunk's own contribution to the state at its end.
            decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [b,c,g,r,Q]
            xdt_to_end = xdt * decay_to_end.permute(0, 1, 4, 2, 3).unsqueeze(-1)
            chunk_states = torch.einsum("bclgn,bclgrp->bcgrpn", B, xdt_to_end)  # [b,c,g,r,p,n]

            # 3. Across chunks: state at the end of chunk z = sum_{c <= z} (decay of chunks c+1..z)
            #    * chunk_states[c]; the state entering chunk z is the one at the end of chunk z-1.
            chunk_log_decay = a_cum[..., -1].permute(0, 2, 3, 1)  # [b,g,r,c]
            carry = torch.exp(_segsum(chunk_log_decay))  # [b,g,r,z,c]
            end_states = torch.einsum("bgrzc,bcgrpn->bzgrpn", carry, chunk_states)
            start_states = F.pad(end_states[:, :-1], (0, 0, 0, 0, 0, 0, 0, 0, 1, 0))

            # 4. Contribution of the incoming state to each position of the chunk.
            y_past = torch.einsum("bclgn,bcgrpn->bclgrp", C, start_states)
            y = y + y_past * torch.exp(a_cum).permute(0, 1, 4, 2, 3).unsqueeze(-1)

        y = y.reshape(b, n_chunks * Q, h, p)[:, :T]
        y = y + x32 * D.to(f32).view(1, 1, h, 1)
    return y.to(out_dtype)


def ssd_recurrent(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
) -> torch.Tensor:
    """The recurrence, one token at a time (slow; the ground truth for tests). Computes in x's dtype."""
    b, T, h, p = x.shape
    g, n = B.shape[-2:]
    r = h // g
    dt = F.softplus(dt + dt_bias)
    Bh = B.repeat_interleave(r, dim=2)  # [b,T,h,n]: head k uses group k // r
    Ch = C.repeat_interleave(r, dim=2)
    state = x.new_zeros(b, h, p, n)
    ys = []
    for t in range(T):
        decay = torch.exp(dt[:, t] * A).view(b, h, 1, 1)
        state = decay * state + (dt[:, t, :, None] * x[:, t]).unsqueeze(-1) * Bh[:, t].unsqueeze(-2)
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]) + D.view(1, h, 1) * x[:, t])
    return torch.stack(ys, dim=1)


# ---- mamba-ssm's Triton kernel --------------------------------------------------------------


# The Triton scan as a torch.library custom op: torch.compile sees one opaque node with a fake
# (shape-only) implementation and a registered backward, so the whole model compiles as one graph
# instead of breaking around mamba-ssm's autograd.Function. Forward and backward call mamba-ssm's own
# `_mamba_chunk_scan_combined_fwd/_bwd`, exactly what `mamba_chunk_scan_combined` runs.
#
# The op takes x, B and C packed as the mixer holds them, one [b, T, d_inner + 2 groups state] tensor (the
# conv's output), and its backward writes their gradients into one tensor of that shape through views (as
# mamba-ssm's `mamba_split_conv1d_scan_combined` does): separate dx, dB and dC would be concatenated by
# autograd's split backward, a full extra pass over the tensor per Mamba layer.
def unpack_xbc(xbc: torch.Tensor, heads: int, head_dim: int, groups: int):
    b, T, width = xbc.shape
    d_inner = heads * head_dim
    state = (width - d_inner) // (2 * groups)
    x, B, C = torch.split(xbc, [d_inner, groups * state, groups * state], dim=-1)
    return x.view(b, T, heads, head_dim), B.view(b, T, groups, state), C.view(b, T, groups, state)


@torch.library.custom_op("nvfp4train::ssd_scan_triton", mutates_args=())
def _ssd_scan_triton(
    xbc: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    chunk_size: int,
    head_dim: int,
    groups: int,
) -> torch.Tensor:
    load_triton_ssd()
    match_triton_determinism()
    x, B, C = unpack_xbc(xbc, dt.shape[-1], head_dim, groups)
    return chunk_scan_forward(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True)[0].contiguous()


# The fakes promise contiguous outputs and the ops make sure of it: inputs arrive as strided views
# (split/rearrange), and `empty_like` of one promised its strides, which inductor asserted on a GPU.
@_ssd_scan_triton.register_fake
def _(xbc, dt, A, D, dt_bias, chunk_size, head_dim, groups):
    b, T, heads = dt.shape
    return xbc.new_empty((b, T, heads, head_dim))


@torch.library.custom_op("nvfp4train::ssd_scan_triton_backward", mutates_args=())
def _ssd_scan_triton_backward(
    dout: torch.Tensor,
    xbc: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    out: torch.Tensor,
    chunk_size: int,
    head_dim: int,
    groups: int,
) -> list[torch.Tensor]:
    match_triton_determinism()
    x, B, C = unpack_xbc(xbc, dt.shape[-1], head_dim, groups)
    dxbc = torch.empty(xbc.shape, dtype=xbc.dtype, device=xbc.device)
    dx, dB, dC = unpack_xbc(dxbc, dt.shape[-1], head_dim, groups)
    with backward_cumsums_allowed():
        _, ddt, dA, _, _, dD, _, ddt_bias, _ = chunk_scan_backward(
            dout.contiguous(),
            x,
            dt,
            A,
            B,
            C,
            out,
            chunk_size,
            D=D,
            dt_bias=dt_bias,
            dt_softplus=True,
            dx=dx,
            dB=dB,
            dC=dC,
        )
    return [dxbc] + [g.contiguous() for g in (ddt, dA, dD, ddt_bias)]


@_ssd_scan_triton_backward.register_fake
def _(dout, xbc, dt, A, D, dt_bias, out, chunk_size, head_dim, groups):
    return [t.new_empty(t.shape) for t in (xbc, dt, A, D, dt_bias)]


def _ssd_setup_context(ctx, inputs, output):
    xbc, dt, A, D, dt_bias, chunk_size, head_dim, groups = inputs
    ctx.save_for_backward(xbc, dt, A, D, dt_bias, output)
    ctx.args = (chunk_size, head_dim, groups)


def _ssd_backward(ctx, dout):
    grads = _ssd_scan_triton_backward(dout, *ctx.saved_tensors, *ctx.args)
    return (*grads, None, None, None)


_ssd_scan_triton.register_autograd(_ssd_backward, setup_context=_ssd_setup_context)


def ssd_chunked_triton(x, dt, A, B, C, D, dt_bias, chunk_size: int) -> torch.Tensor:
    """mamba-ssm's Triton SSD through the custom op above (traceable by torch.compile), from x, B and C
    apart: packed by a copy first (the mixer passes them packed: `ssd_scan_packed`)."""
    b, T, heads, head_dim = x.shape
    groups = B.shape[2]
    xbc = torch.cat([x.reshape(b, T, -1), B.reshape(b, T, -1), C.reshape(b, T, -1)], dim=-1)
    return _ssd_scan_triton(xbc, dt, A, D, dt_bias, chunk_size, head_dim, groups)


@assume_constant_result
def _triton_ssd_deterministic() -> bool:
    return triton_ssd_deterministic_mode()


def resolve_ssd_backend(
    backend: str, is_cuda: bool, deterministic: bool, triton_available: bool, triton_deterministic: bool
) -> str:
    """The scan that runs: "auto" takes mamba-ssm's Triton kernels on CUDA when they are installed (in
    deterministic mode only a mamba-ssm that has one), else the PyTorch scan. ValueError in one line for
    what cannot run."""
    if backend == "auto":
        use_triton = is_cuda and triton_available and (triton_deterministic or not deterministic)
        return "triton" if use_triton else "torch"
    if backend == "triton":
        if not is_cuda:
            raise ValueError("ssd_backend='triton' needs CUDA tensors; use 'torch' or 'auto' on CPU")
        if deterministic and not triton_deterministic:
            raise ValueError(
                "ssd_backend='triton' in deterministic mode needs mamba-ssm >= 2.3 (its deterministic "
                "backward); use model.ssd_backend=auto or torch"
            )
        return "triton"
    if backend == "torch":
        return "torch"
    raise ValueError(f"ssd_backend: {backend!r} is not one of auto, torch, triton")


def resolved_ssd_backend(is_cuda: bool, backend: str) -> str:
    deterministic = torch.are_deterministic_algorithms_enabled()
    use_triton_check = is_cuda and backend != "torch"
    return resolve_ssd_backend(
        backend,
        is_cuda,
        deterministic,
        triton_ssd_available() if use_triton_check else False,
        _triton_ssd_deterministic() if use_triton_check and deterministic else False,
    )


def ssd_scan(x, dt, A, B, C, D, dt_bias, chunk_size: int, backend: str = "auto") -> torch.Tensor:
    """Dispatch to a backend: "torch", "triton" (CUDA tensors only) or "auto" (resolve_ssd_backend)."""
    if resolved_ssd_backend(x.is_cuda, backend) == "torch":
        return ssd_chunked_torch(x, dt, A, B, C, D, dt_bias, chunk_size)
    return ssd_chunked_triton(x, dt, A, B, C, D, dt_bias, chunk_size)


def ssd_scan_packed(
    xbc, dt, A, D, dt_bias, chunk_size: int, head_dim: int, groups: int, backend: str = "auto"
) -> torch.Tensor:
    """`ssd_scan` of x, B and C packed along the last dimension of xbc [b, T, heads head_dim + 2 groups state],
    the layout the Mamba mixer's conv writes: y [b, T, heads, head_dim]. The Triton backend takes the packed
    tensor whole (and gives its gradient as one tensor); the PyTorch scan takes views of it."""
    if resolved_ssd_backend(xbc.is_cuda, backend) == "torch":
        x, B, C = unpack_xbc(xbc, dt.shape[-1], head_dim, groups)
        return ssd_chunked_torch(x, dt, A, B, C, D, dt_bias, chunk_size)
    return _ssd_scan_triton(xbc, dt, A, D, dt_bias, chunk_size, head_dim, groups)


# ---- depthwise causal conv1d ----------------------------------------------------------------


def conv_backend(is_cuda: bool, deterministic: bool, extension_available: bool, triton_available: bool) -> str:
    """Which causal conv runs: causal_conv1d's CUDA extension where it imports, except in deterministic mode
    (its weight-gradient kernel is not audited here; ours writes per-tile partial sums that one torch sum
    reduces, so it repeats bit for bit: causal_conv.py); else our Triton kernels; else F.conv1d (cuDNN,
    deterministic when torch.backends.cudnn.deterministic is set, as train.deterministic does)."""
    if is_cuda and extension_available and not deterministic:
        return "causal_conv1d"
    if is_cuda and triton_available:
        return "triton"
    return "torch"


def causal_conv1d_silu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, use_kernel: bool = True
) -> torch.Tensor:
    """SiLU(depthwise causal conv) over time. x [b, T, channels] (channels contiguous; the mixer's slice
    of in_proj's output), weight [channels, 1, k]; the output is [b, T, channels].

    On CUDA (conv_backend): causal_conv1d's CUDA kernel when importable (not in deterministic mode), else
    our Triton kernels (causal_conv.py, when triton is installed and there is a bias). Otherwise F.conv1d
    on the input transposed and left-padded by k-1 (so the output has exactly T positions and position t
    sees only inputs t-k+1..t).
    """
    k = weight.shape[-1]
    backend = "torch"
    if use_kernel and x.is_cuda:
        backend = conv_backend(
            True,
            torch.are_deterministic_algorithms_enabled(),
            causal_conv1d_kernel_available(),
            bias is not None and triton_conv_available(),
        )
    if backend == "causal_conv1d":
        # an attribute of the package, read here: the eager wrapper is made on first use (ops/mamba_kernels.py)
        return ops.causal_conv1d_extension(x.transpose(1, 2), weight, bias).transpose(1, 2)
    if backend == "triton":
        from .causal_conv import causal_conv1d_silu_triton

        return causal_conv1d_silu_triton(x, weight, bias)
    y = F.conv1d(F.pad(x.transpose(1, 2), (k - 1, 0)), weight, bias, groups=x.shape[2])
    return F.silu(y).transpose(1, 2)


@assume_constant_result
def triton_conv_available() -> bool:
    from nvfp4train.formats.impl import triton_available  # NVFP4TRAIN_TRITON=0 turns it off too

    return triton_available()
