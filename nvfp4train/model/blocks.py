"""The three block types of the hybrid family and their norms.

Each block is pre-RMSNorm -> mixer -> residual add. Every linear layer comes from the layer factory
(`layers.LayerFactory`: `factory.linear(in_features, out_features, *, block_index, name)`, and the MLP from
`factory.mlp(...)` where the factory has its own), so the precision package can hand out quantized layers;
everything else (norms, conv1d, the SSD scan, attention's softmax and batched matmuls) stays in high precision
here.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .config import ModelConfig
from .fused_norm import fused_norm_available, fused_rms_norm
from .layers import LayerFactory
from .marks import assume_constant_result
from .mixer_op import mamba_conv_scan_norm, mixer_op_applies
from .ssd import causal_conv1d_silu, ssd_scan_packed


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, computed in float32, returned in `out_dtype` (default x's dtype; one
    Triton kernel on CUDA when mamba-ssm's are installed: fused_norm.py)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if x.is_cuda and fused_norm_available():
            return fused_rms_norm(x, self.weight, self.eps, out_dtype=out_dtype)
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(out_dtype or x.dtype)

    def add_and_norm(
        self, x: torch.Tensor, h: torch.Tensor, out_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + h in x's dtype, this norm of it): the residual add before the norm, one Triton kernel each way
        on CUDA (residual_norm.py), the same values as the add followed by `forward`."""
        if x.is_cuda and fused_norm_available():
            from .residual_norm import fused_add_rms_norm  # triton: imported where the kernels run

            return fused_add_rms_norm(x, h, self.weight, self.eps, out_dtype or x.dtype)
        x = x + h
        return x, self(x, out_dtype)


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm: RMSNorm(y * silu(z)) over groups of `group_size` channels.

    "Gate before norm" (Megatron / mamba-ssm `norm_before_gate=False`); one group per Mamba
    group, so the normalization never mixes channels of different B/C groups. One Triton kernel on
    CUDA when mamba-ssm's are installed (fused_norm.py).
    """

    def __init__(self, dim: int, group_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if y.is_cuda and fused_norm_available():
            return fused_rms_norm(y, self.weight, self.eps, z=z, group_size=self.group_size)
        gated = y.float() * F.silu(z.float())
        grouped = gated.unflatten(-1, (-1, self.group_size))
        normed = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed.flatten(-2) * self.weight.float()).to(y.dtype)


class Mamba2Mixer(nn.Module):
    """in_proj -> depthwise causal conv1d + SiLU on (x, B, C) -> SSD scan -> gated RMSNorm -> out_proj.

    in_proj produces, per token, [z (d_inner) | x (d_inner) | B (groups*state) | C (groups*state)
    | dt (heads)] — the same order as Megatron's MambaMixer and mamba-ssm's Mamba2. out_proj is
    applied here, outside any fused kernel, so a quantized out_proj is really used.
    """

    def __init__(self, cfg: ModelConfig, block_index: int, factory: LayerFactory):
        super().__init__()
        self.d_inner = cfg.mamba_d_inner
        self.n_heads = cfg.mamba_heads
        self.head_dim = cfg.mamba_head_dim
        self.groups = cfg.mamba_groups
        self.state = cfg.mamba_state
        self.chunk = cfg.mamba_chunk
        self.ssd_backend = cfg.ssd_backend
        conv_dim = cfg.mamba_conv_dim

        # its output is read only through the splits below, so a GEMM's padded output needs no cropping copy
        self.in_proj = factory.linear(
            cfg.d_model, cfg.mamba_in_proj_dim, block_index=block_index, name="in_proj", strided_output=True
        )
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, cfg.mamba_conv, groups=conv_dim, bias=True)
        self.dt_bias = nn.Parameter(torch.empty(self.n_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.D = nn.Parameter(torch.empty(self.n_heads))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // self.groups, cfg.norm_eps)
        self.out_proj = factory.linear(self.d_inner, cfg.d_model, block_index=block_index, name="out_proj")
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self, dt_min: float = 1e-3, dt_max: float = 0.1, dt_floor: float = 1e-4) -> None:
        """Mamba-2 / Megatron init: dt ~ logUniform[dt_min, dt_max] stored as softplus^-1 in
        dt_bias, A = -U[1, 16] stored as log, D = 1, conv1d PyTorch's default (kaiming uniform)."""
        if self.A_log.is_meta:
            return
        dt = torch.exp(torch.rand(self.n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus
        self.A_log.copy_(torch.log(torch.empty(self.n_heads).uniform_(1.0, 16.0)))
        self.D.fill_(1.0)
        self.conv1d.reset_parameters()

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        b, T, _ = u.shape
        zxbcdt = self.in_proj(u)
        if mixer_op_applies(zxbcdt.is_cuda, self.ssd_backend):  # the same kernels as below, as one op
            y = mamba_conv_scan_norm(
                zxbcdt,
                self.conv1d.weight,
                self.conv1d.bias,
                -torch.exp(self.A_log.float()),
                self.D,
                self.dt_bias,
                self.norm.weight,
                self.norm.eps,
                self.d_inner,
                self.head_dim,
                self.groups,
                self.norm.group_size,
                self.chunk,
            )[0]
            return self.out_proj(y)
        z, xBC, dt = torch.split(zxbcdt, [self.d_inner, self.conv1d.in_channels, self.n_heads], dim=-1)
        xBC = causal_conv1d_silu(xBC, self.conv1d.weight, self.conv1d.bias)
        y = ssd_scan_packed(  # x, B, C: views of xBC
            xBC,
            dt,
            -torch.exp(self.A_log.float()),
            self.D,
            self.dt_bias,
            chunk_size=self.chunk,
            head_dim=self.head_dim,
            groups=self.groups,
            backend=self.ssd_backend,
        )
        y = self.norm(y.reshape(b, T, self.d_inner), z)
        return self.out_proj(y)


def apply_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, "rotate half" layout (Megatron's default, rotary_interleaved=False).
    x [b, heads, T, head_dim]; angles computed on the fly in float32 (cheap, compile-friendly)."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    angles = torch.outer(torch.arange(T, device=x.device, dtype=torch.float32), inv_freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


# Deterministic attention where the model is compiled: "flex" (default: FlexAttention, Inductor's template,
# whose backward loops over blocks without atomics and keeps the scores on chip) or "math" (SDPA's math backend,
# which writes the T x T scores and computes them in FP32; it replays the bits of runs made with it, such as
# the committed campaign's). Eager deterministic runs take math either way. Read once; train/determinism.py refuses
# another value in one line.
DETERMINISTIC_ATTENTION_ENV = "NVFP4TRAIN_DETERMINISTIC_ATTENTION"
DETERMINISTIC_ATTENTION_CHOICES = ("flex", "math")
DETERMINISTIC_ATTENTION_DEFAULT = "flex"


def attention_backend(
    is_cuda: bool, deterministic: bool, compiling: bool = False, choice: str = DETERMINISTIC_ATTENTION_DEFAULT
) -> str:
    """The attention kernel: on CUDA in deterministic mode "flex" under torch.compile with choice="flex", else
    "math" (SDPA's math backend: plain matmuls and a softmax, whose backward sums in a fixed order; cuDNN's and
    flash's backward kernels accumulate in an order that varies from run to run); "auto" outside deterministic
    mode (SDPA picks its fastest kernel)."""
    if not (is_cuda and deterministic):
        return "auto"
    return "flex" if choice == "flex" and compiling else "math"


@assume_constant_result
def _deterministic_attention_choice() -> str:
    return os.environ.get(DETERMINISTIC_ATTENTION_ENV, DETERMINISTIC_ATTENTION_DEFAULT)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def flex_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Causal attention with FlexAttention (q [b, heads, T, d], k and v [b, kv_heads, T, d]); the block mask
    skips the blocks above the diagonal."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    T = q.shape[-2]
    mask = create_block_mask(_causal, None, None, T, T, device=q.device)
    return flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)


class Attention(nn.Module):
    """Causal grouped-query self-attention: fused qkv linear -> (RoPE) -> SDPA -> out linear."""

    def __init__(self, cfg: ModelConfig, block_index: int, factory: LayerFactory):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.rope_theta = cfg.rope_theta if cfg.rope else None
        qkv_dim = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.qkv = factory.linear(cfg.d_model, qkv_dim, block_index=block_index, name="qkv")
        self.out = factory.linear(cfg.n_heads * cfg.head_dim, cfg.d_model, block_index=block_index, name="out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim], dim=-1
        )
        q = q.view(b, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.rope_theta is not None:
            q, k = apply_rope(q, self.rope_theta), apply_rope(k, self.rope_theta)
        gqa = self.n_kv_heads != self.n_heads
        backend = attention_backend(
            x.is_cuda,
            torch.are_deterministic_algorithms_enabled(),
            torch.compiler.is_compiling(),
            _deterministic_attention_choice(),
        )
        if backend == "flex":
            y = flex_causal_attention(q, k, v, gqa)
        elif backend == "math":
            with sdpa_kernel(SDPBackend.MATH):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.out(y.transpose(1, 2).reshape(b, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """fc1 -> squared ReLU -> fc2 (non-gated, no biases; Nemotron-H's FFN), the two linears from the factory.
    A factory may build the whole MLP instead (`build_mlp`: the precision package's FP8 MLP applies the activation
    inside its quantizers)."""

    def __init__(self, cfg: ModelConfig, block_index: int, factory: LayerFactory):
        super().__init__()
        self.fc1 = factory.linear(cfg.d_model, cfg.ffn_hidden, block_index=block_index, name="fc1")
        self.fc2 = factory.linear(cfg.ffn_hidden, cfg.d_model, block_index=block_index, name="fc2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)).square())


def build_mlp(cfg: ModelConfig, block_index: int, factory: LayerFactory) -> nn.Module:
    """The factory's MLP for this block where it has one, else `MLP` from two of its linears."""
    own = factory.mlp(cfg.d_model, cfg.ffn_hidden, block_index=block_index)
    return own if own is not None else MLP(cfg, block_index, factory)


MIXERS = {"M": Mamba2Mixer, "*": Attention, "-": build_mlp}


class Block(nn.Module):
    """x + mixer(RMSNorm(x)). `index` is the position in the pattern, `kind` its symbol.

    The residual add is deferred to the start of the next block, so that it runs in one kernel with that
    block's norm (`RMSNorm.add_and_norm`); after the last block HybridLM adds it before the final norm.
    `forward(x, h)` takes the stream and the previous block's mixer output h (None for the first block) and
    returns (x + h, this block's mixer output)."""

    def __init__(self, cfg: ModelConfig, index: int, kind: str, factory: LayerFactory):
        super().__init__()
        self.index = index
        self.kind = kind
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = MIXERS[kind](cfg, index, factory)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # Every mixer starts with a linear, which under autocast casts its input to the autocast dtype:
        # the norm writes that dtype itself, without an FP32 output and a cast kernel forward, nor a
        # widening of the linear's dX to FP32 backward. The same bits on CPU; the Triton kernel's FP32
        # result depends on its output dtype in the last bit (a few BF16 outputs one ulp apart:
        # tests/gpu/test_fused_norm.py, docs/results/code-measurements.md).
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        if h is None:
            return x, self.mixer(self.norm(x, dtype))
        x, normed = self.norm.add_and_norm(x, h, dtype)
        return x, self.mixer(normed)

    def extra_repr(self) -> str:
        return f"index={self.index}, kind={self.kind!r}"
