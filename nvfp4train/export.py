"""`python -m nvfp4train.export run_dir=RUN [step=N] [out=DIR] [dtype=float32|bfloat16]`.

Consolidates any checkpoint of a run (one process, DDP, FSDP2's per-rank DCP shards, DeepSpeed ZeRO)
into one `model.safetensors` plus `config.json`, readable without the training code:

    from safetensors.torch import load_file
    state = load_file("export/model.safetensors")        # {"blocks.0.mixer.in_proj.weight": ...}
    config = json.load(open("export/config.json"))        # {"model": {...}, "step": ..., ...}

`config.json` holds the model config (everything `nvfp4train.model.build_model` needs), the step and
tokens trained, the training precision and the tokenizer's file name; the tokenizer file is copied
beside it when it is a `tokenizers` JSON. Only model weights are exported (no optimizer state).
Options: configs/export.yaml. Bad input ends with one line and exit code 2, with nothing written.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from nvfp4train.eval.cli import compose, help_requested, optional_int, usage
from nvfp4train.eval.weights import RunError, load_run_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def export(run_dir: Path, step: int | None = None, out: Path | None = None, dtype: str = "float32") -> Path:
    """Write model.safetensors + config.json for the run's checkpoint; return the output directory."""
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise RunError(f"dtype={dtype!r}: allowed: {', '.join(DTYPES)}")
    model, run_config, ckpt = load_run_model(Path(run_dir), step)
    meta = json.loads((ckpt / "meta.json").read_text())
    out = Path(out) if out else Path(run_dir) / "export" / ckpt.name
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt", "step": str(meta["step"])})
    tokenizer = str(run_config.get("data", {}).get("tokenizer", ""))
    tokenizer_file = None
    if tokenizer.endswith(".json"):
        from nvfp4train.data.paths import resolve_path
        src = resolve_path(tokenizer)
        if src.is_file():
            shutil.copyfile(src, out / "tokenizer.json")
            tokenizer_file = "tokenizer.json"
    config = {
        "architecture": "nvfp4train.model.HybridLM",
        "model": {k: v for k, v in run_config["model"].items() if k != "ssd_backend"},
        "dtype": dtype, "step": meta["step"], "tokens": meta.get("tokens"),
        "training_precision": run_config.get("precision", {}).get("name"),
        "seq_len": run_config.get("train", {}).get("seq_len"),
        "tokenizer": tokenizer, "tokenizer_file": tokenizer_file,
        "source_checkpoint": str(ckpt), "engine": meta.get("engine", "torch"),
        "world_size": meta.get("world_size"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


def load_export(path: Path):
    """The exported model (nvfp4train's HybridLM with plain linears) and its config.json."""
    from safetensors.torch import load_file

    from nvfp4train.model import build_model

    config = json.loads((Path(path) / "config.json").read_text())
    model = build_model(config["model"])
    model.load_state_dict({k: v.float() for k, v in load_file(str(Path(path) / "model.safetensors")).items()})
    return model.eval(), config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if help_requested(argv):
        print(usage("export", __doc__))
        return 0
    try:
        cfg = compose("export", argv)
        out = export(Path(cfg["run_dir"]), optional_int("step", cfg["step"]), cfg["out"], cfg["dtype"])
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = json.loads((out / "config.json").read_text())
    print(json.dumps({"out": str(out), "step": config["step"], "dtype": config["dtype"],
                      "bytes": (out / "model.safetensors").stat().st_size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
