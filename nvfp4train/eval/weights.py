"""A run directory's checkpoint -> a plain model with its trained weights, for evaluation and export.

Whatever wrote the checkpoint (one process, DDP, FSDP2 with one DCP shard per rank, DeepSpeed ZeRO-1/2),
the result is the same: the model of the run's `config.yaml` built with ordinary `nn.Linear` layers (the
paper evaluates in BF16, so the training-time quantized linears are not needed) and the FP32 weights.
Only model tensors are read: the optimizer moments and per-rank trainer state stay on disk.

Every refusal is a `RunError` with one line naming the file and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nvfp4train.model import HybridLM, build_model
from nvfp4train.runs import RunError, read_config
from nvfp4train.train import checkpoint


def read_run_config(run_dir: Path, required: dict[str, tuple[str, ...]] | None = None) -> dict:
    """The resolved config a run wrote (`config.yaml`), read and checked by `nvfp4train.runs.read_config`."""
    return read_config(run_dir, required)


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The checkpoint of `step` (default: the latest complete one) under `<run_dir>/checkpoints/`."""
    root = Path(run_dir) / "checkpoints"
    found = checkpoint.list_checkpoints(root)
    if not found:
        raise RunError(f"{root}: no complete checkpoint (train with train.save_every or to the end of the run)")
    if step is None:
        return found[-1]
    for ckpt in found:
        if checkpoint.step_of(ckpt) == step:
            return ckpt
    steps = ", ".join(str(checkpoint.step_of(p)) for p in found)
    raise RunError(f"step={step}: no checkpoint of that step in {root}; available steps: {steps}")


def model_config_for(run_config: dict) -> dict:
    """The model config to build: the run's, with the SSD backend left to the machine that evaluates."""
    return {k: v for k, v in run_config["model"].items() if k != "ssd_backend"}


def load_state_dict(ckpt: Path, model: HybridLM) -> dict[str, torch.Tensor]:
    """The model tensors of `ckpt` as a plain {name: tensor} dict shaped like `model.state_dict()`."""
    meta = checkpoint.read_meta(ckpt)
    engine = meta.get("engine", "torch")
    if engine == "deepspeed":
        return _deepspeed_state_dict(ckpt, model)
    if engine != "torch":
        raise RunError(f"{ckpt / checkpoint.META}: unknown engine {engine!r}; known: torch, deepspeed")
    try:
        return checkpoint.load_model_tensors(ckpt, model.state_dict())
    except checkpoint.CheckpointError as e:
        raise RunError(str(e)) from None


def _deepspeed_state_dict(ckpt: Path, model: HybridLM) -> dict[str, torch.Tensor]:
    """ZeRO-1/2 keep the whole (BF16) module in `mp_rank_00_model_states.pt`; read it weights-only."""
    path = ckpt / "deepspeed" / "mp_rank_00_model_states.pt"
    try:
        try:
            from nvfp4train.train.engines import load_deepspeed_file

            saved = load_deepspeed_file(str(path))
        except ImportError:  # DeepSpeed not installed: its records cannot be named, plain tensors still load
            saved = checkpoint.load_weights_only(path)
    except checkpoint.CheckpointError as e:
        raise RunError(str(e)) from None
    module = saved.get("module") if isinstance(saved, dict) else None
    if not isinstance(module, dict):
        raise RunError(f"{path}: has no `module` state dict; not a DeepSpeed model checkpoint")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(module))
    if missing:
        raise RunError(f"{path}: tensors missing for this model: {', '.join(missing[:5])}")
    return {k: module[k].float() for k in expected}


def load_run_model(run_dir: Path, step: int | None = None, device: str | torch.device = "cpu"):
    """(model in eval mode with the checkpoint's weights, run config, checkpoint path)."""
    run_config = read_run_config(run_dir)
    ckpt = find_checkpoint(run_dir, step)
    model_config = model_config_for(run_config)
    try:
        checkpoint.check_compatible(ckpt, checkpoint.read_meta(ckpt), run_config["model"])
    except checkpoint.CheckpointError as e:
        raise RunError(f"{e} (config.yaml of {run_dir} describes another model than its checkpoint)") from None
    try:
        model = build_model(model_config)
    except (TypeError, ValueError) as e:
        raise RunError(f"{Path(run_dir) / 'config.yaml'}: model: {e}") from None
    state = load_state_dict(ckpt, model)
    check_weights_finite(ckpt, state)
    model.load_state_dict(state)
    return model.to(device).eval(), run_config, ckpt


def check_weights_finite(ckpt: Path, state: dict[str, torch.Tensor]) -> None:
    """NaN or inf weights are refused before anything is evaluated, exported or sampled (train/checkpoint.py)."""
    try:
        checkpoint.check_finite(ckpt, state.items(), advice="name an earlier checkpoint with step=<N>")
    except checkpoint.CheckpointError as e:
        raise RunError(str(e)) from None


def pick_device(setting: str) -> str:
    """A command's `device` option (auto | cpu | cuda, checked by its config) -> the device to load onto."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise RunError("device=cuda: no CUDA device on this machine")
    return str(setting)
