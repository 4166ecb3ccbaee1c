"""Print a model preset's parameter count and training FLOPs per token, without allocating weights.

    python -m nvfp4train.summary model=nemotron_h_12b
    python -m nvfp4train.summary model=hybrid_tiny model.d_model=192 train.seq_len=256

Arguments are Hydra-style overrides: `model=NAME` picks `configs/model/NAME.yaml`,
`model.KEY=VALUE` overrides one field, `train.seq_len=N` (or `seq_len=N`) sets the sequence length
the FLOPs are computed for (default: train.seq_len's default, what `python -m nvfp4train.train` trains
at; the paper's is 8192). The model is built on the meta device. The last
line of output is JSON: {"params": ..., "flops_per_token": ...} (training FLOPs, fwd + bwd).
"""

from __future__ import annotations

import json
import sys

import torch

from nvfp4train.config import ConfigError, help_requested, load, usage
from nvfp4train.model import HybridLM, ModelConfig, flops_per_token

KIND_NAMES = {"M": "mamba", "*": "attention", "-": "mlp"}


def load_model_config(overrides: list[str]) -> tuple[ModelConfig, int]:
    """The ModelConfig and sequence length of `model=NAME`, `model.KEY=VALUE` and `train.seq_len=N` (or
    `seq_len=N`) overrides (configs/summary.yaml); bad input raises ConfigError."""
    overrides = ["train." + o if o.startswith("seq_len=") else o for o in overrides]
    cfg = load("summary", overrides)
    return cfg.model, cfg.train.seq_len


def summarize(cfg: ModelConfig, seq_len: int) -> dict:
    with torch.device("meta"):
        model = HybridLM(cfg)
    params_by_kind = {kind: 0 for kind in KIND_NAMES}
    for block in model.blocks:
        params_by_kind[block.kind] += sum(p.numel() for p in block.parameters())
    flops = flops_per_token(cfg, seq_len)
    return {
        "params": model.num_params(),
        "params_non_embedding": model.num_params(exclude_embeddings=True),
        "params_by_kind": {KIND_NAMES[k]: v for k, v in params_by_kind.items()},
        "flops": flops,
    }


def main(argv: list[str]) -> int:
    if help_requested(argv):
        print(usage("summary", __doc__))
        return 0
    try:
        cfg, seq_len = load_model_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = summarize(cfg, seq_len)
    f = s["flops"]
    print(
        f"model {cfg.name}: pattern {cfg.pattern} ({cfg.n_blocks} blocks: "
        + ", ".join(f"{cfg.count(k)} {v}" for k, v in KIND_NAMES.items())
        + ")"
    )
    print(f"parameters: {s['params']:,} total, {s['params_non_embedding']:,} without embedding and LM head")
    for kind, n in s["params_by_kind"].items():
        print(f"  {kind:<10} {n:>16,}")
    print(f"training FLOPs per token at seq_len {seq_len} (fwd+bwd, causal): {f['total']:.4e}")
    for key in ("mamba", "attention", "mlp", "lm_head"):
        print(f"  {key:<10} {f[key]:>12.4e}  ({100 * f[key] / f['total']:.1f}%)")
    print(f"  6 * params = {6 * s['params']:.4e} (the usual dense estimate, for comparison)")
    print(json.dumps({"params": s["params"], "flops_per_token": f["total"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
