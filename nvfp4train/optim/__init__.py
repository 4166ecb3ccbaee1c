"""Optimizer and learning-rate schedules (FP32 master weights, FP32 AdamW state)."""

from typing import TYPE_CHECKING

from nvfp4train.optim.config import OptimConfig
from nvfp4train.optim.schedules import ScheduleConfig, lr_at

if TYPE_CHECKING:
    from nvfp4train.optim.adamw import build_optimizer


def __getattr__(name: str):
    if name == "build_optimizer":  # with torch, on first use: the config above loads without it
        from nvfp4train.optim.adamw import build_optimizer

        return build_optimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OptimConfig", "build_optimizer", "ScheduleConfig", "lr_at"]
