"""How one optimizer step runs, per engine: PyTorch (single process, DDP, FSDP2, HSDP: torch.py) or DeepSpeed
ZeRO (deepspeed.py). Both are an `Engine` (base.py), the interface the loop uses:
    engine.train_step(micro_batches, lr, step) -> StepStats (device tensors: loss, grad_norm, applied)
    engine.save(ckpt_dir) / engine.load(ckpt_dir, meta)   model weights + optimizer state
    engine.module                                         the model to evaluate
    engine.captured_at(start_step)                        the step captured as a CUDA graph, or None
    engine.close()                                        free the captured step
The loop stays the same whichever engine runs; checkpoint directories share one layout. What the engine
does (compile, capture, FSDP2's resharding) was decided before it is built: train/plan.py's RunPlan.
"""

from __future__ import annotations

from nvfp4train import parallel
from nvfp4train.optim import OptimConfig
from nvfp4train.train.engines.base import Engine, StepStats
from nvfp4train.train.engines.deepspeed import (
    DeepSpeedEngine,
    deepspeed_arch_list,
    import_deepspeed,
    load_deepspeed_file,
)
from nvfp4train.train.engines.torch import TorchEngine, allow_a_compile_per_block
from nvfp4train.train.plan import RunPlan


def build_engine(model, groups, optim_cfg: OptimConfig, plan: RunPlan, train_cfg, info: parallel.DistInfo) -> Engine:
    """The engine `plan` says, for `model` (`groups(model)`: its optimizer parameter groups). `train_cfg`
    gives the explicit settings the plan leaves as they are (activation checkpointing, ZeRO stage, FSDP2's
    prefetch, DDP's bucket size)."""
    model.set_activation_checkpointing(str(train_cfg.activation_checkpointing))
    if plan.parallel == "deepspeed":
        return DeepSpeedEngine(
            model, groups, optim_cfg, train_cfg.zero_stage, plan.grad_accum, plan.micro_batch_size, info
        )
    return TorchEngine(
        model,
        groups,
        optim_cfg,
        str(train_cfg.parallel),
        info,
        compile=plan.compile,
        reshard_after_forward=bool(plan.fsdp_reshard_after_forward),
        cuda_graph=plan.cuda_graph,
        fsdp_prefetch=train_cfg.fsdp_prefetch,
        ddp_bucket_cap_mb=train_cfg.ddp_bucket_cap_mb,
        hsdp_shard_size=plan.hsdp_shard_size or 0,
    )


__all__ = [
    "DeepSpeedEngine",
    "Engine",
    "StepStats",
    "TorchEngine",
    "allow_a_compile_per_block",
    "build_engine",
    "deepspeed_arch_list",
    "import_deepspeed",
    "load_deepspeed_file",
]
