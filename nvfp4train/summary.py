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

from nvfp4train.model import HybridLM, ModelConfig, flops_per_token
from nvfp4train.train.config import CONFIG_DIR as TRAIN_CONFIG_DIR

CONFIG_DIR = TRAIN_CONFIG_DIR / "model"
KIND_NAMES = {"M": "mamba", "*": "attention", "-": "mlp"}


def load_model_config(overrides: list[str]) -> tuple[ModelConfig, int]:
    """Compose a ModelConfig from `model=NAME`, `model.KEY=VALUE` and `seq_len=N` overrides."""
    import yaml
    from omegaconf import OmegaConf  # config composition lives here, not in nvfp4train.model
    from omegaconf.errors import OmegaConfBaseException

    from nvfp4train.train.config import TrainConfig

    name, seq_len, field_overrides = "hybrid_tiny", TrainConfig().seq_len, []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"argument {item!r}: expected KEY=VALUE (model=NAME, model.KEY=VALUE, train.seq_len=N)")
        if key == "model":
            name = value
        elif key in ("seq_len", "train.seq_len"):
            seq_len = int(value) if value.strip().isdigit() else 0
            if seq_len < 1:
                raise ValueError(f"{key}={value}: expected a positive integer")
        elif key.startswith("model."):
            field_overrides.append(item[len("model."):])
        else:
            raise ValueError(f"argument {item!r}: unknown key {key!r}; allowed: model, model.<field>, train.seq_len")
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        presets = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ValueError(f"model={name}: no file {path}; available presets: {', '.join(presets)}")
    try:
        merged = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(field_overrides))
    # a value that is not YAML (`model.d_model=[1`), a preset that is not either
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ValueError(f"{', '.join(field_overrides) or path}: not valid YAML "
                         f"({' '.join(str(e).splitlines()[0].split())[:200]})") from None
    return ModelConfig.from_dict(OmegaConf.to_container(merged, resolve=True)), seq_len


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
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m nvfp4train.summary [model=NAME] [model.KEY=VALUE ...] [train.seq_len=N]\n")
        print(__doc__.strip())
        return 0
    try:
        cfg, seq_len = load_model_config(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = summarize(cfg, seq_len)
    f = s["flops"]
    print(f"model {cfg.name}: pattern {cfg.pattern} ({cfg.n_blocks} blocks: "
          + ", ".join(f"{cfg.count(k)} {v}" for k, v in KIND_NAMES.items()) + ")")
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
