"""Cross-entropy fused with the output projection, chunked over tokens.

`F.cross_entropy(lm_head(h).float(), targets)` keeps FP32 logits for the whole batch alive until
backward (batch x seq x vocab x 4 bytes: 8 GiB for 8 x 2048 x 128k) and casts them twice. Here the
logits of `chunk_tokens` tokens at a time are computed, reduced to their loss and dropped; backward
recomputes them per chunk and accumulates the hidden-state and weight gradients (Liger's and
torchtune's chunked / fused linear cross-entropy do the same). The GEMM runs in the autocast dtype
(BF16 in training) exactly as the `nn.Linear` it replaces; softmax and the loss are FP32, so the loss
equals `F.cross_entropy` of the autocast logits up to the order of the sum.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_TOKENS = 4096  # FP32 logits of one chunk: 4096 x vocab x 4 bytes (2 GiB at a 128k vocabulary)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype nn.Linear would run in here: the autocast dtype when autocast is on, else the weight's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, dtype: torch.dtype, ignore_index: int):
        # hidden [N, d], weight [V, d], targets [N]; returns the sum of the per-token losses (FP32)
        w = weight.to(dtype)  # one cast of the master weight for all chunks
        total = hidden.new_zeros((), dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk_tokens):
                logits = F.linear(hidden[start:start + chunk_tokens].to(dtype), w).float()
                total = total + F.cross_entropy(logits, targets[start:start + chunk_tokens], reduction="sum",
                                                ignore_index=ignore_index)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk_tokens, ctx.dtype, ctx.ignore_index = chunk_tokens, dtype, ignore_index
        return total

    @staticmethod
    def backward(ctx, grad_total):
        hidden, weight, targets = ctx.saved_tensors
        dtype, chunk = ctx.dtype, ctx.chunk_tokens
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                h = hidden[start:start + chunk].to(dtype)
                y = targets[start:start + chunk]
                logits = F.linear(h, w).float()
                # d(sum of losses)/d logits = softmax - one_hot(target); ignored tokens contribute nothing
                valid = (y != ctx.ignore_index).unsqueeze(-1)
                grad_logits = torch.softmax(logits, dim=-1)
                grad_logits.scatter_add_(1, y.clamp(min=0).unsqueeze(-1), -valid.float())
                grad_logits = (grad_logits * (valid * grad_total)).to(dtype)
                if grad_hidden is not None:
                    grad_hidden[start:start + chunk] = grad_logits @ w
                if grad_weight is not None:
                    grad_weight += (grad_logits.t() @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         reduction: str = "mean", chunk_tokens: int = CHUNK_TOKENS,
                         ignore_index: int = -100) -> torch.Tensor:
    """cross_entropy(hidden @ weight.T, targets) without materialising all the logits.

    hidden [..., d], weight [vocab, d], targets [...] (int64). reduction: "mean" over the non-ignored
    tokens, or "sum". Returns an FP32 scalar."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r}: allowed mean, sum")
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    total = _LinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens, _compute_dtype(hidden, weight),
                                      ignore_index)
    if reduction == "sum":
        return total
    return total / (targets != ignore_index).sum().clamp(min=1)


__all__ = ["CHUNK_TOKENS", "linear_cross_entropy"]
