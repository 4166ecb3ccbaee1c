"""Optimizer and learning-rate schedules (FP32 master weights, FP32 AdamW state)."""

from nvfp4train.optim.adamw import OptimConfig, build_optimizer
from nvfp4train.optim.schedules import ScheduleConfig, lr_at

__all__ = ["OptimConfig", "build_optimizer", "ScheduleConfig", "lr_at"]
