"""HybridLM: embedding -> blocks (pattern of M / * / -) -> final RMSNorm -> LM head.

Untied input embedding and LM head, no biases, no position embedding (RoPE optional inside
attention). The embedding, norms and LM head are plain high-precision modules; the linears
inside blocks come from the layer factory (layers.py).

Initialization (Megatron / Nemotron-H): every weight matrix ~ N(0, init_std), except the
output-side linears of each block (Mamba out_proj, attention out, MLP fc2), which use
N(0, init_std / sqrt(2 * n_blocks)) (Megatron's `scaled_init_method_normal` with
num_layers = pattern length, as Megatron's hybrid model counts layers). Norm weights are 1,
the LM head and the embedding use init_std. Mamba's A_log, D, dt_bias and conv1d keep their
Mamba-2 init (blocks.Mamba2Mixer.reset_ssm_parameters).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.utils.checkpoint

from .blocks import Block, GatedRMSNorm, Mamba2Mixer, RMSNorm
from .config import ModelConfig
from .layers import LINEAR_NAMES, OUTPUT_LINEARS, PLAIN_LAYERS, LayerFactory
from .loss import linear_cross_entropy


class HybridLM(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_factory: LayerFactory | None = None):
        """layer_factory: where the blocks' linears (and MLPs) come from (layers.py); None: `PLAIN_LAYERS`."""
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        factory = PLAIN_LAYERS if layer_factory is None else layer_factory
        if not isinstance(factory, LayerFactory):
            raise TypeError(
                f"HybridLM: layer_factory must have linear() and mlp() (model.layers.LayerFactory), "
                f"got {type(factory).__name__}"
            )
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i, kind, factory) for i, kind in enumerate(cfg.pattern))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.checkpointed: frozenset[int] = frozenset()  # blocks whose activations backward recomputes
        self.reset_parameters()

    def set_activation_checkpointing(self, mode: str) -> None:
        """none | full (every block recomputes its activations in backward) | selective (every second
        block, torchtitan's per-layer selective checkpointing: about half the activation memory for
        about a third of full checkpointing's extra forward)."""
        every = {"none": 0, "full": 1, "selective": 2}
        if mode not in every:
            raise ValueError(f"activation_checkpointing={mode!r}: allowed {', '.join(every)}")
        self.checkpointed = frozenset(range(0, len(self.blocks), every[mode])) if every[mode] else frozenset()

    @torch.no_grad()
    def reset_parameters(self, include_ssm_and_norms: bool = False) -> None:
        """Initialize the weight matrices. With include_ssm_and_norms=True also the norms and the
        Mamba SSM parameters (which the constructor already set), so a model built on the meta
        device can be materialized with `model.to_empty(device=...)` and then this call."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_blocks)
        if include_ssm_and_norms:
            for module in self.modules():
                if isinstance(module, (RMSNorm, GatedRMSNorm)):
                    module.weight.fill_(1.0)
                elif isinstance(module, Mamba2Mixer):
                    module.reset_ssm_parameters()
        nn.init.normal_(self.embedding.weight, 0.0, std)
        nn.init.normal_(self.lm_head.weight, 0.0, std)
        for block in self.blocks:
            for name in LINEAR_NAMES:  # a mixer has one input and one output linear: input first either way
                linear = getattr(block.mixer, name, None)
                if linear is not None:
                    nn.init.normal_(linear.weight, 0.0, out_std if name in OUTPUT_LINEARS else std)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"
    ) -> torch.Tensor:
        """tokens [B, T] (int64) -> logits [B, T, vocab] (float32, or the autocast dtype); with targets
        [B, T], the FP32 next-token cross-entropy instead ("mean" or "sum" over tokens), computed chunk
        by chunk from the final hidden state so the full FP32 logits never exist (loss.py)."""
        x, h = self.embedding(tokens), None  # the stream, and the mixer output each block adds to it first
        for i, block in enumerate(self.blocks):
            if i in self.checkpointed and torch.is_grad_enabled():
                # non-reentrant: works with torch.compile and FSDP2; the RNG state is restored for the recompute
                x, h = torch.utils.checkpoint.checkpoint(block, x, h, use_reentrant=False)
            else:
                x, h = block(x, h)
        x = self.final_norm(x + h)
        if targets is None:
            return self.lm_head(x)
        return linear_cross_entropy(x, self.lm_head.weight, targets, reduction=reduction)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embedding.weight.numel() + self.lm_head.weight.numel()
        return n


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups, following Megatron's default `no_weight_decay_cond`:
    decay every parameter with >= 2 dims (linear weights, embedding, LM head, conv1d weight);
    no decay for 1-D parameters (RMSNorm weights, conv1d bias, Mamba's A_log, D, dt_bias) and
    for anything named `*.bias`. Frozen parameters are left out."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name.endswith(".bias") else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "group": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "group": "no_decay"},
    ]
