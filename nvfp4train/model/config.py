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

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Mapping

BLOCK_KINDS = {"M": "mamba", "*": "attention", "-": "mlp"}
SSD_BACKENDS = ("auto", "torch", "triton")


@dataclass
class ModelConfig:
    # Identity and layout.
    name: str = "hybrid_tiny"  # preset name, only used for logging
    pattern: str = "M-*-M-"  # one symbol per block, see module docstring
    vocab_size: int = 8192  # rows of the (untied) embedding and LM head
    d_model: int = 128  # residual stream width
    # MLP blocks ("-"): fc1 d_model -> ffn_hidden, squared ReLU, fc2 ffn_hidden -> d_model.
    ffn_hidden: int = 512
    # Attention blocks ("*"): grouped-query attention with n_heads query heads sharing
    # n_kv_heads key/value heads, each head_dim wide (Megatron's --kv-channels).
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    # Mamba-2 blocks ("M"): d_inner = mamba_expand * d_model, split into
    # d_inner / mamba_head_dim heads; B and C are shared within mamba_groups groups of heads;
    # mamba_state is the SSM state size N; mamba_conv the depthwise causal conv width;
    # mamba_chunk the SSD chunk length (a speed knob; the result does not depend on it).
    mamba_groups: int = 2
    mamba_state: int = 32
    mamba_head_dim: int = 32
    mamba_expand: int = 2
    mamba_conv: int = 4
    mamba_chunk: int = 64
    # Rotary position embedding in attention blocks (off for the hybrids, which have no
    # position embedding at all; on for the 1.2B Transformer ablation model).
    rope: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5  # RMSNorm epsilon (Megatron's Nemotron-H configs use 1e-5)
    # Std of the normal init of embedding and input-side linears; output-side linears
    # (Mamba out_proj, attention out, MLP fc2) use init_std / sqrt(2 * n_blocks) (Megatron).
    init_std: float = 0.02
    # SSD scan backend: "torch" (chunked pure-PyTorch reference, runs everywhere),
    # "triton" (mamba-ssm's mamba_chunk_scan_combined, CUDA only), "auto" (triton on CUDA
    # when importable, else torch).
    ssd_backend: str = "auto"

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

    def count(self, kind: str) -> int:
        """Number of blocks of one kind ("M", "*" or "-")."""
        return self.pattern.count(kind)

    # ---- construction and validation -----------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Build and validate a config; any problem raises a one-line ValueError naming the key."""
        if not isinstance(d, Mapping):
            raise ValueError(f"model config must be a mapping of keys to values, got {type(d).__name__}")
        allowed = [f.name for f in fields(cls)]
        for key in d:
            if key not in allowed:
                raise ValueError(f"model config: unknown key {key!r}; allowed keys: {', '.join(allowed)}")
        cfg = cls(**{k: _coerce(k, v, _field_type(k)) for k, v in d.items()})
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        for f in fields(self):
            setattr(self, f.name, _coerce(f.name, getattr(self, f.name), _field_type(f.name)))
        if not self.pattern:
            raise ValueError("model.pattern: must be a non-empty string of block symbols M, *, -")
        for i, ch in enumerate(self.pattern):
            if ch not in BLOCK_KINDS:
                raise ValueError(
                    f"model.pattern: character {ch!r} at position {i} is not a block symbol; "
                    f"allowed: 'M' (Mamba-2), '*' (attention), '-' (MLP)"
                )
        positive = ["vocab_size", "d_model", "ffn_hidden", "n_heads", "n_kv_heads", "head_dim",
                    "mamba_groups", "mamba_state", "mamba_head_dim", "mamba_expand", "mamba_conv",
                    "mamba_chunk"]
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"model.{key}: must be a positive integer, got {getattr(self, key)}")
        for key in ("norm_eps", "init_std", "rope_theta"):
            if not getattr(self, key) > 0:
                raise ValueError(f"model.{key}: must be > 0, got {getattr(self, key)}")
        if self.ssd_backend not in SSD_BACKENDS:
            raise ValueError(f"model.ssd_backend: {self.ssd_backend!r} is not one of {', '.join(SSD_BACKENDS)}")
        if "*" in self.pattern:
            if self.n_heads % self.n_kv_heads != 0:
                raise ValueError(
                    f"model.n_kv_heads: {self.n_kv_heads} must divide n_heads={self.n_heads} "
                    f"(grouped-query attention shares each KV head among n_heads/n_kv_heads query heads)"
                )
            if self.rope and self.head_dim % 2 != 0:
                raise ValueError(f"model.head_dim: must be even when rope=true, got {self.head_dim}")
        if "M" in self.pattern:
            if self.mamba_d_inner % self.mamba_head_dim != 0:
                raise ValueError(
                    f"model.mamba_head_dim: {self.mamba_head_dim} must divide "
                    f"d_inner = mamba_expand * d_model = {self.mamba_d_inner}"
                )
            if self.mamba_heads % self.mamba_groups != 0:
                raise ValueError(
                    f"model.mamba_groups: {self.mamba_groups} must divide the number of Mamba heads "
                    f"(d_inner / mamba_head_dim = {self.mamba_heads})"
                )


_TYPES: dict[str, type] = {}


def _field_type(name: str) -> type:
    if not _TYPES:
        hints = {"str": str, "int": int, "float": float, "bool": bool}
        for f in fields(ModelConfig):
            _TYPES[f.name] = hints[f.type] if isinstance(f.type, str) else f.type
    return _TYPES[name]


def _coerce(key: str, value: Any, typ: type) -> Any:
    """Accept exactly the field's type (ints and numeric strings for floats too); reject bools posing as ints."""
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads "1e-5" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str):
            return value
    raise ValueError(f"model.{key}: expected {typ.__name__}, got {value!r} ({type(value).__name__})")
