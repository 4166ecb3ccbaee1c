"""How one optimizer step runs, per engine: PyTorch (single process, DDP, FSDP2) or DeepSpeed ZeRO.

Both give the loop the same small interface:
    engine.train_step(micro_batches, lr, step) -> StepStats (device tensors: loss, grad_norm, applied)
    engine.save(ckpt_dir) / engine.load(ckpt_dir)       model weights + optimizer state
    engine.module                                       the model to evaluate
The loop stays the same whichever engine runs; checkpoint directories share one layout.
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn

from nvfp4train import dist
from nvfp4train.model.blocks import Mamba2Mixer
from nvfp4train.schema import ConfigError
from nvfp4train.train.cuda_graph import cuda_graph_blocker
from nvfp4train.train.engines.base import StepStats
from nvfp4train.train.engines.deepspeed import (
    DeepSpeedEngine,
    deepspeed_arch_list,
    import_deepspeed,
    load_deepspeed_file,
)
from nvfp4train.train.engines.torch import TorchEngine, allow_a_compile_per_block

log = logging.getLogger(__name__)


def resolve_compile(setting: str, device: torch.device, model: nn.Module | None = None) -> bool:
    """train.compile: auto compiles on CUDA only (on CPU compiling costs more than it saves); true on CPU
    is refused for a model with Mamba blocks, whose PyTorch SSD scan Inductor's CPU code gets wrong."""
    if (
        setting == "true"
        and device.type == "cpu"
        and model is not None
        and any(isinstance(m, Mamba2Mixer) for m in model.modules())
    ):
        raise ConfigError(
            f"train.compile=true: on CPU, torch {torch.__version__.split('+')[0]}'s compiled code for the Mamba "
            "blocks' SSD scan returns NaN (eager is right); allowed here: auto (compiles on CUDA only) or false"
        )
    return device.type == "cuda" if setting == "auto" else setting == "true"


def resolve_cuda_graph(
    setting: str,
    model: nn.Module,
    info: dist.DistInfo,
    parallel: str,
    activation_checkpointing: str = "none",
    fsdp_reshard: bool = False,
) -> bool:
    """train.cuda_graph: auto captures the step where it can (cuda_graph.cuda_graph_blocker), true
    refuses a run where it cannot, naming why. fsdp_reshard: FSDP2 reshards after forward (resolved)."""
    if setting == "false":
        return False
    blocker = cuda_graph_blocker(
        model,
        info.device,
        info.world_size,
        parallel,
        activation_checkpointing,
        explicit=setting == "true",
        fsdp_reshard=fsdp_reshard,
    )
    if blocker is None:
        return True
    if setting == "true":
        raise ConfigError(
            f"train.cuda_graph=true: cannot capture the step here: {blocker}; "
            f"allowed: auto (captures where it can) or false"
        )
    log.info("train.cuda_graph=auto: eager steps (%s)", blocker)
    return False


def build_engine(model, groups, optim_cfg, train_cfg, info, grad_accum):
    model.set_activation_checkpointing(str(train_cfg.activation_checkpointing))
    if train_cfg.parallel == "deepspeed":
        return DeepSpeedEngine(
            model, groups, optim_cfg, train_cfg.zero_stage, grad_accum, train_cfg.micro_batch_size, info
        )
    reshard = str(train_cfg.fsdp_reshard_after_forward)
    n_params = sum(p.numel() for p in model.parameters())
    fsdp_reshard = (
        train_cfg.parallel in ("fsdp2", "hsdp") and dist.resolve_reshard_after_forward(reshard, n_params, info)[0]
    )
    return TorchEngine(
        model,
        groups,
        optim_cfg,
        train_cfg.parallel,
        info,
        compile=resolve_compile(str(train_cfg.compile), info.device, model),
        reshard_after_forward=reshard,
        fsdp_prefetch=train_cfg.fsdp_prefetch,
        ddp_bucket_cap_mb=train_cfg.ddp_bucket_cap_mb,
        hsdp_shard_size=train_cfg.hsdp_shard_size,
        cuda_graph=resolve_cuda_graph(
            str(train_cfg.cuda_graph),
            model,
            info,
            train_cfg.parallel,
            str(train_cfg.activation_checkpointing),
            fsdp_reshard,
        ),
    )


__all__ = [
    "StepStats",
    "TorchEngine",
    "allow_a_compile_per_block",
    "load_deepspeed_file",
    "DeepSpeedEngine",
    "build_engine",
    "deepspeed_arch_list",
    "import_deepspeed",
    "resolve_compile",
    "resolve_cuda_graph",
]
