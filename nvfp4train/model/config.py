"""Model configuration: one flat dataclass that describes every preset of the hybrid family.

A model is a string of block symbols (Megatron's `--hybrid-layer-pattern` language):

    M  Mamba-2 block      (pre-RMSNorm -> Mamba-2 mixer   -> residual)
    *  attention block    (pre-RMSNorm -> GQA attention   -> residual)
    -  MLP block          (pre-RMSNorm -> squared-ReLU MLP -> residual)

A pure Transformer is the pattern "*-" repeated; the 12B Nemotron-H hybrid is
"M-M-M-M*-..." (`configs/model/nemotron_h_12b.yaml`). Field defaults describe `hybrid_tiny`, the CPU default,
and match `configs/model/hybrid_tiny.yaml`.

This module knows nothing about Hydra: `from_dict` takes any mapping of plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nvfp4train.config.schema import ConfigError, bounded, check, parse, to_plain

BLOCK_KINDS = {"M": "mamba", "*": "attention", "-": "mlp"}
# The linears each block kind's mixer builds through the layer factory (layers.py), in the order it builds them;
# HybridLM holds them at `blocks.<i>.mixer.<name>`, the names precision.modules' patterns match.
BLOCK_LINEARS = {"M": ("in_proj", "out_proj"), "*": ("qkv", "out"), "-": ("fc1", "fc2")}


SsdBackend = StrEnum("SsdBackend", "auto torch triton")


@dataclass
class ModelConfig:
    # Identity and layout.
    name: str = "hybrid_tiny"
    """Preset name, only used for logging."""
    pattern: str = "M-*-M-"
    """One symbol per block, see the module docstring."""
    vocab_size: int = bounded(8192, ge=1)
    """Rows of the (untied) embedding and LM head."""
    d_model: int = bounded(128, ge=1)
    """Residual stream width."""
    ffn_hidden: int = bounded(512, ge=1)
    """MLP blocks ("-"): fc1 d_model -> ffn_hidden, squared ReLU, fc2 ffn_hidden -> d_model."""
    n_heads: int = bounded(4, ge=1)
    """Attention blocks ("*"): query heads of grouped-query attention."""
    n_kv_heads: int = bounded(2, ge=1)
    """Key/value heads, each shared by n_heads / n_kv_heads query heads."""
    head_dim: int = bounded(32, ge=1)
    """Width of one attention head (Megatron's --kv-channels)."""
    mamba_groups: int = bounded(2, ge=1)
    """Mamba-2 blocks ("M"): B and C are shared within this many groups of heads."""
    mamba_state: int = bounded(32, ge=1)
    """SSM state size N."""
    mamba_head_dim: int = bounded(32, ge=1)
    """d_inner = mamba_expand * d_model is split into d_inner / mamba_head_dim heads."""
    mamba_expand: int = bounded(2, ge=1)
    """d_inner / d_model."""
    mamba_conv: int = bounded(4, ge=1)
    """Width of the depthwise causal conv."""
    mamba_chunk: int = bounded(64, ge=1)
    """SSD chunk length (a speed knob; the result does not depend on it)."""
    rope: bool = False
    """Rotary position embedding in attention blocks (off for the hybrids, which have no position
    embedding at all; on for the 1.2B Transformer ablation model)."""
    rope_theta: float = bounded(10000.0, gt=0)
    """RoPE base."""
    norm_eps: float = bounded(1e-5, gt=0)
    """RMSNorm epsilon (Megatron's Nemotron-H configs use 1e-5)."""
    init_std: float = bounded(0.02, gt=0)
    """Std of the normal init of embedding and input-side linears; output-side linears (Mamba out_proj,
    attention out, MLP fc2) use init_std / sqrt(2 * n_blocks) (Megatron)."""
    ssd_backend: SsdBackend = SsdBackend.auto
    """SSD scan: torch (chunked pure-PyTorch reference, runs everywhere), triton (mamba-ssm's
    mamba_chunk_scan_combined, CUDA only), auto (triton on CUDA when importable, else torch)."""

    def __post_init__(self):
        self.validate()

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        return len(self.pattern)

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_expand * self.d_model

    @property
    def mamba_heads(self) -> int:
        return self.mamba_d_inner // self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels that go through the causal conv: x, B and C (not z, not dt)."""
        return self.mamba_d_inner + 2 * self.mamba_groups * self.mamba_state

    @property
    def mamba_in_proj_dim(self) -> int:
        """in_proj output: z (d_inner) + xBC (conv_dim) + dt (one per head)."""
        return self.mamba_d_inner + self.mamba_conv_dim + self.mamba_heads

    def linear_modules(self) -> dict[str, tuple[int, str]]:
        """{module name in HybridLM: (block index, linear name)} of every linear the precision factory builds."""
        return {
            f"blocks.{i}.mixer.{name}": (i, name) for i, kind in enumerate(self.pattern) for name in BLOCK_LINEARS[kind]
        }

    def count(self, kind: str) -> int:
        """Number of blocks of one kind ("M", "*" or "-")."""
        return self.pattern.count(kind)

    def block_params(self, kind: str) -> int:
        """Parameters of one block of a kind: its pre-norm and its mixer (a factory's linears are bias-free
        [out, in] weights, as `layers.LayerFactory` asks, so any factory gives the same count)."""
        d = self.d_model
        if kind == "M":
            conv = self.mamba_conv_dim * (self.mamba_conv + 1)  # depthwise weight [C, 1, k] and bias
            ssm = 3 * self.mamba_heads + self.mamba_d_inner  # dt_bias, A_log, D; the gated norm's weight
            mixer = d * self.mamba_in_proj_dim + conv + ssm + self.mamba_d_inner * d
        elif kind == "*":
            mixer = d * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim + self.n_heads * self.head_dim * d
        else:
            mixer = 2 * d * self.ffn_hidden
        return d + mixer

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """`HybridLM(self).num_params()` from the config alone, without building the model (which, even on
        the meta device, takes a while for the large presets): tests/model/test_presets.py checks the two agree."""
        blocks = sum(self.count(kind) * self.block_params(kind) for kind in BLOCK_KINDS)
        embeddings = 0 if exclude_embeddings else 2 * self.vocab_size * self.d_model  # untied: embedding, LM head
        return blocks + self.d_model + embeddings  # + the final norm

    # ---- construction and validation -----------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build and validate a config; any problem raises a one-line ConfigError naming the key."""
        return parse(cls, d, "model")

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def validate(self) -> None:
        """Check every field, then the rules between fields (also after a field was changed in place)."""
        check(self, "model")
        if not self.pattern:
            raise ConfigError("model.pattern: must be a non-empty string of block symbols M, *, -")
        for i, ch in enumerate(self.pattern):
            if ch not in BLOCK_KINDS:
                raise ConfigError(
                    f"model.pattern: character {ch!r} at position {i} is not a block symbol; "
                    f"allowed: 'M' (Mamba-2), '*' (attention), '-' (MLP)"
                )
        if "*" in self.pattern:
            if self.n_heads % self.n_kv_heads != 0:
                raise ConfigError(
                    f"model.n_kv_heads: {self.n_kv_heads} must divide n_heads={self.n_heads} "
                    f"(grouped-query attention shares each KV head among n_heads/n_kv_heads query heads)"
                )
            if self.rope and self.head_dim % 2 != 0:
                raise ConfigError(f"model.head_dim: must be even when rope=true, got {self.head_dim}")
        if "M" in self.pattern:
            if self.mamba_d_inner % self.mamba_head_dim != 0:
                raise ConfigError(
                    f"model.mamba_head_dim: {self.mamba_head_dim} must divide "
                    f"d_inner = mamba_expand * d_model = {self.mamba_d_inner}"
                )
            if self.mamba_heads % self.mamba_groups != 0:
                raise ConfigError(
                    f"model.mamba_groups: {self.mamba_groups} must divide the number of Mamba heads "
                    f"(d_inner / mamba_head_dim = {self.mamba_heads})"
                )
