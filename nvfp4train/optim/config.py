"""The optimizer's options (`optim.*`): a module without torch, so that every command's config loads without it."""

from __future__ import annotations

from dataclasses import dataclass, field

from nvfp4train.config.schema import ConfigError, bounded, check, parse
from nvfp4train.optim.schedules import ScheduleConfig


@dataclass(frozen=True)
class OptimConfig:
    lr: float = bounded(3e-3, gt=0.0)
    """Peak learning rate."""
    min_lr: float = bounded(3e-5, ge=0.0)
    """The schedule decays to this (the paper: 1% of the peak)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's beta1, beta2, each in [0, 1)."""
    eps: float = bounded(1e-8, gt=0.0)
    """AdamW's epsilon."""
    weight_decay: float = bounded(0.1, ge=0.0)
    """On matrices only; norms, biases, embeddings' 1-D params and SSM scalars get none."""
    grad_clip: float = bounded(1.0, ge=0.0)
    """Global-norm clipping; 0 disables it."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""

    def __post_init__(self):
        check(self, "optim")
        if self.min_lr > self.lr:
            raise ConfigError(f"optim.min_lr={self.min_lr}: must be <= optim.lr={self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={list(self.betas)}: must be two values in [0, 1)")

    @classmethod
    def from_dict(cls, d: dict) -> OptimConfig:
        return parse(cls, d, "optim")
