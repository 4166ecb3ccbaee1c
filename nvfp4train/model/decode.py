"""Incremental decoding for HybridLM: a state cache per block, so each new token costs one token's work.

    logits, cache = prefill(model, prompt_ids)      # [b, vocab] for the last prompt position
    logits = decode_step(model, next_ids, cache)    # [b, vocab] for one more token per row

What a block remembers:
  M  Mamba-2: the last (conv width - 1) inputs of the causal conv and the SSM state S [b, heads, head_dim,
     state] in FP32 (the recurrence of ssd.py: S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t);
  *  attention: the keys (rotated, when the model uses RoPE) and values of every position so far;
  -  MLP: nothing.

`prefill` runs the model's own forward (the training path, untouched: the prompt's logits are the bits
`model(tokens)` gives) and reads the cache off it with forward hooks on in_proj / qkv; the SSM state at the
prompt's end is the scan's closed form, sum_t exp(sum_{s>t} dt_s A) dt_t x_t B_t^T, with the decay summed
from the end (no difference of cumulative sums, which cancels). `decode_step` is the step-by-step
recurrence; tests/model/test_decode.py checks it against the full forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .blocks import Attention, Mamba2Mixer
from .hybrid import HybridLM
from .ssd import causal_conv1d_silu


@dataclass
class DecodeCache:
    """Per-block state after `length` tokens: {block index: {"conv", "ssm"} or {"k", "v"}}."""

    length: int = 0
    blocks: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)


def _rope_at(x: torch.Tensor, theta: float, start: int) -> torch.Tensor:
    """blocks.apply_rope for positions start, start+1, ... (the same angles and "rotate half" layout)."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    angles = torch.outer(torch.arange(start, start + T, device=x.device, dtype=torch.float32), inv_freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def _mamba_cache(m: Mamba2Mixer, zxbcdt: torch.Tensor) -> dict[str, torch.Tensor]:
    """Conv inputs and SSM state at the end of the prompt, from in_proj's output [b, T, ...]."""
    b, T, _ = zxbcdt.shape
    k = m.conv1d.kernel_size[0]
    _, xBC, dt = torch.split(zxbcdt, [m.d_inner, m.conv1d.in_channels, m.n_heads], dim=-1)
    conv = (
        F.pad(xBC.transpose(1, 2), (max(k - 1 - T, 0), 0))[:, :, -(k - 1) :]
        if k > 1
        else xBC.new_zeros(b, xBC.shape[2], 0)
    )
    act = causal_conv1d_silu(xBC, m.conv1d.weight, m.conv1d.bias)
    x, B, _ = torch.split(act, [m.d_inner, m.groups * m.state, m.groups * m.state], dim=-1)
    with torch.autocast(zxbcdt.device.type, enabled=False):
        dt = F.softplus(dt.float() + m.dt_bias.float())  # [b, T, h]
        log_decay = dt * -torch.exp(m.A_log.float())
        # Decay from each position to the end, excluding the position itself: suffix sums from the end.
        after = F.pad(log_decay.flip(1).cumsum(1).flip(1)[:, 1:], (0, 0, 0, 1))
        weight = torch.exp(after) * dt
        Bh = B.float().reshape(b, T, m.groups, m.state).repeat_interleave(m.n_heads // m.groups, dim=2)
        ssm = torch.einsum("bth,bthp,bthn->bhpn", weight, x.float().reshape(b, T, m.n_heads, m.head_dim), Bh)
    return {"conv": conv.contiguous(), "ssm": ssm}


def _attention_cache(a: Attention, qkv: torch.Tensor) -> dict[str, torch.Tensor]:
    b, T, _ = qkv.shape
    _, k, v = qkv.split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim], dim=-1)
    k = k.reshape(b, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
    v = v.reshape(b, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
    if a.rope_theta is not None:
        k = _rope_at(k, a.rope_theta, 0)
    return {"k": k.contiguous(), "v": v.contiguous()}


@torch.no_grad()
def prefill(model: HybridLM, tokens: torch.Tensor) -> tuple[torch.Tensor, DecodeCache]:
    """tokens [b, T] -> (logits of the last position [b, vocab], the cache after T tokens)."""
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    for i, block in enumerate(model.blocks):
        linear = {"M": "in_proj", "*": "qkv"}.get(block.kind)
        if linear:
            hooks.append(
                getattr(block.mixer, linear).register_forward_hook(
                    lambda _m, _inp, out, i=i: captured.__setitem__(i, out)
                )
            )
    try:
        logits = model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    cache = DecodeCache(length=tokens.shape[1])
    for i, block in enumerate(model.blocks):
        if block.kind == "M":
            cache.blocks[i] = _mamba_cache(block.mixer, captured[i])
        elif block.kind == "*":
            cache.blocks[i] = _attention_cache(block.mixer, captured[i])
    return logits[:, -1], cache


def _mamba_step(m: Mamba2Mixer, u: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    b = u.shape[0]
    zxbcdt = m.in_proj(u)[:, 0]
    z, xBC, dt = torch.split(zxbcdt, [m.d_inner, m.conv1d.in_channels, m.n_heads], dim=-1)
    window = torch.cat([state["conv"], xBC[:, :, None]], dim=-1)  # [b, channels, k]
    state["conv"] = window[:, :, 1:]
    with torch.autocast(u.device.type, enabled=False):
        conv = (window.float() * m.conv1d.weight[:, 0].float()).sum(-1) + m.conv1d.bias.float()
        x, B, C = torch.split(F.silu(conv), [m.d_inner, m.groups * m.state, m.groups * m.state], dim=-1)
        x = x.reshape(b, m.n_heads, m.head_dim)
        r = m.n_heads // m.groups
        Bh = B.reshape(b, m.groups, m.state).repeat_interleave(r, dim=1)
        Ch = C.reshape(b, m.groups, m.state).repeat_interleave(r, dim=1)
        dt = F.softplus(dt.float() + m.dt_bias.float())  # [b, h]
        decay = torch.exp(dt * -torch.exp(m.A_log.float()))
        state["ssm"] = decay[:, :, None, None] * state["ssm"] + (dt[:, :, None] * x)[..., None] * Bh[:, :, None, :]
        y = torch.einsum("bhpn,bhn->bhp", state["ssm"], Ch) + m.D.float()[None, :, None] * x
    y = m.norm(y.reshape(b, 1, m.d_inner).to(zxbcdt.dtype), z[:, None])
    return m.out_proj(y)


def _attention_step(a: Attention, u: torch.Tensor, state: dict[str, torch.Tensor], position: int) -> torch.Tensor:
    b = u.shape[0]
    q, k, v = a.qkv(u).split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim], dim=-1)
    q = q.view(b, 1, a.n_heads, a.head_dim).transpose(1, 2)
    k = k.view(b, 1, a.n_kv_heads, a.head_dim).transpose(1, 2)
    v = v.view(b, 1, a.n_kv_heads, a.head_dim).transpose(1, 2)
    if a.rope_theta is not None:
        q, k = _rope_at(q, a.rope_theta, position), _rope_at(k, a.rope_theta, position)
    state["k"] = torch.cat([state["k"], k.to(state["k"].dtype)], dim=2)
    state["v"] = torch.cat([state["v"], v.to(state["v"].dtype)], dim=2)
    keys, values = state["k"].to(q.dtype), state["v"].to(q.dtype)
    y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=a.n_kv_heads != a.n_heads)  # sees all the past
    return a.out(y.transpose(1, 2).reshape(b, 1, a.n_heads * a.head_dim))


@torch.no_grad()
def decode_step(model: HybridLM, tokens: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
    """tokens [b] (one new token per row) -> logits [b, vocab] for the next position; updates `cache`."""
    x = model.embedding(tokens[:, None])
    device = x.device.type
    for i, block in enumerate(model.blocks):
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype  # as Block
        h = block.norm(x, dtype)
        if block.kind == "M":
            out = _mamba_step(block.mixer, h, cache.blocks[i])
        elif block.kind == "*":
            out = _attention_step(block.mixer, h, cache.blocks[i], cache.length)
        else:
            out = block.mixer(h)
        x = x + out
    cache.length += 1
    return model.lm_head(model.final_norm(x))[:, 0]
