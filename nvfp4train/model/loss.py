"""Cross-entropy fused with the output projection, chunked over tokens.

`F.cross_entropy(lm_head(h).float(), targets)` keeps FP32 logits for the whole batch alive until
backward (batch x seq x vocab x 4 bytes: 8 GiB for 8 x 2048 x 128k) and casts them twice. Here the
logits of `chunk_tokens` tokens at a time are computed, reduced to their loss and to their share of
the hidden-state and weight gradients, and dropped (Liger's fused linear cross-entropy). The GEMMs run
in the autocast dtype (BF16 in training) exactly as the `nn.Linear` it replaces; log-softmax and the
loss are FP32, so the loss equals `F.cross_entropy` of the autocast logits up to the order of the sum,
and the gradients equal its gradients up to where the 1/N of the mean is applied (after the BF16
GEMMs here, before them there). The FP32 weight gradient (vocab x d_model) is held from forward to
backward.

Log-softmax is written out as its decomposition (max, log of the sum of exponentials) and the logits'
gradient, softmax - one_hot(target), as one out-of-place expression of the logits: under torch.compile
a chunk's logits are then only read, in the GEMM's dtype, by the per-token reductions and by the
element-wise kernel that writes the gradient in that dtype, and no FP32 tensor of their size is written
(an in-place exp_/scatter_add_ on FP32 log-probabilities forces them into memory: 12 bytes of traffic
per BF16 logit, against about 6). Eager, where each expression is its own pass over an FP32 temporary of a
chunk's size, the same operations run in place on one FP32 copy instead, with the same numbers. On CPU
the sum of exponentials is not ordered as in ATen's fused log_softmax kernel, so the loss and the
gradients can differ in the last bits from those computed with `torch.log_softmax`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_TOKENS = 4096  # FP32 logits of one chunk: 4096 x vocab x 4 bytes (2 GiB at a 128k vocabulary)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype nn.Linear would run in here: the autocast dtype when autocast is on, else the weight's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def _chunk_loss_traced(logits, index, valid, need_grad: bool):
    """A chunk's summed negative log-likelihood (FP32) and, with need_grad, the FP32 gradient of its logits
    (softmax - one_hot(target), zero on ignored tokens), as torch.compile should see them: log_softmax as
    torch decomposes it, shifted - log(sum(exp(shifted))) with shifted = x - max(x), and the gradient as
    out-of-place expressions of the logits, so that compiled no FP32 tensor of their size is written
    (module docstring); the cast and the shift are recomputed where used rather than held."""
    amax = logits.float().amax(-1, keepdim=True)
    lse = torch.log(torch.exp(logits.float() - amax).sum(-1, keepdim=True))
    logp_target = (logits.gather(1, index).float() - amax) - lse
    loss = (logp_target * valid).sum()
    if not need_grad:
        return loss, None
    p = torch.exp((logits.float() - amax) - lse)
    is_target = torch.arange(logits.shape[-1], device=logits.device) == index
    return loss, torch.where(is_target, p - 1, p) * valid


def _chunk_loss_eager(logits, index, valid, need_grad: bool):
    """_chunk_loss_traced's numbers bit for bit, for eager runs: the same operations on the same values,
    the logits cast and shifted once and the shift, exponential and target's -1 applied in place, so that
    each FP32 pass over the chunk is made once (eager, every expression is a pass over memory, and the
    element-wise passes cost the CPU default run more than its GEMMs) and at most two FP32 copies of the
    chunk live at once."""
    shifted = logits.to(torch.float32, copy=True)  # a copy also of FP32 logits: the caller's stay as they are
    shifted -= shifted.amax(-1, keepdim=True)
    lse = torch.log(torch.exp(shifted).sum(-1, keepdim=True))
    loss = ((shifted.gather(1, index) - lse) * valid).sum()
    if not need_grad:
        return loss, None
    p = shifted.sub_(lse).exp_()
    p.scatter_(1, index, p.gather(1, index) - 1)
    return loss, p.mul_(valid)


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes, chunk by chunk, the summed loss and already the gradients of hidden and weight
    (d loss / d logits = softmax - one_hot is known once the logits are): no logits are kept or
    recomputed, and backward only scales by the incoming gradient (Liger's fused linear cross-entropy
    does the same). The GEMMs are those of nn.Linear + F.cross_entropy: one forward, two backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, dtype: torch.dtype, ignore_index: int):
        # hidden [N, d], weight [V, d], targets [N]; returns the sum of the per-token losses (FP32)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(dtype)  # one cast of the master weight for all chunks
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk_tokens):
                h = hidden[start : start + chunk_tokens].to(dtype)
                y = targets[start : start + chunk_tokens]
                valid = (y != ignore_index).unsqueeze(-1)
                index = y.clamp(min=0).unsqueeze(-1)
                logits = F.linear(h, w)
                need_grad = need_hidden or need_weight
                chunk_loss = _chunk_loss_traced if torch.compiler.is_compiling() else _chunk_loss_eager
                loss, grad_logits = chunk_loss(logits, index, valid, need_grad)
                total = total - loss
                if need_grad:
                    grad_logits = grad_logits.to(dtype)
                    if need_hidden:
                        grad_hidden[start : start + chunk_tokens] = grad_logits @ w
                    if need_weight:
                        grad_weight += (grad_logits.t() @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_total
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_total).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    reduction: str = "mean",
    chunk_tokens: int = CHUNK_TOKENS,
    ignore_index: int = -100,
) -> torch.Tensor:
    """cross_entropy(hidden @ weight.T, targets) without materialising all the logits.

    hidden [..., d], weight [vocab, d], targets [...] (int64). reduction: "mean" over the non-ignored
    tokens, or "sum". Returns an FP32 scalar."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r}: allowed mean, sum")
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    total = _LinearCrossEntropy.apply(
        hidden, weight, targets, chunk_tokens, _compute_dtype(hidden, weight), ignore_index
    )
    if reduction == "sum":
        return total
    return total / (targets != ignore_index).sum().clamp(min=1)


__all__ = ["CHUNK_TOKENS", "linear_cross_entropy"]
