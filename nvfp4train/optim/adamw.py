"""AdamW over FP32 master weights.

The model's parameters are kept in FP32 and are the master weights; forward and backward run under
BF16 autocast (or FSDP2's bf16 `param_dtype`), so every GEMM sees BF16 (or quantized) compute
weights while gradients, their accumulation over micro-batches and both Adam moments stay FP32.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from nvfp4train.optim.schedules import ScheduleConfig


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-3
    min_lr: float = 3e-5
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    @classmethod
    def from_dict(cls, d: dict) -> "OptimConfig":
        allowed = {f.name for f in fields(cls)}
        for key in d:
            if key not in allowed:
                raise ValueError(f"optim.{key}: unknown key; allowed: {', '.join(sorted(allowed))}")
        d = dict(d)
        sched = d.pop("schedule", {}) or {}
        sched_allowed = {f.name for f in fields(ScheduleConfig)}
        for key in sched:
            if key not in sched_allowed:
                raise ValueError(f"optim.schedule.{key}: unknown key; allowed: {', '.join(sorted(sched_allowed))}")
        if "betas" in d:
            d["betas"] = tuple(float(b) for b in d["betas"])
        cfg = cls(**d, schedule=ScheduleConfig(**sched))
        if cfg.lr <= 0 or cfg.min_lr < 0 or cfg.min_lr > cfg.lr:
            raise ValueError(f"optim.lr={cfg.lr}, optim.min_lr={cfg.min_lr}: need lr > 0 and 0 <= min_lr <= lr")
        if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
            raise ValueError(f"optim.betas={list(cfg.betas)}: need two values in [0, 1)")
        if cfg.weight_decay < 0 or cfg.grad_clip < 0 or cfg.eps <= 0:
            raise ValueError("optim.weight_decay and optim.grad_clip must be >= 0 and optim.eps > 0")
        return cfg


def build_optimizer(param_groups: list[dict], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW on the given groups (each group may carry its own `weight_decay`)."""
    for group in param_groups:
        for p in group["params"]:
            if p.dtype != torch.float32:
                raise TypeError(f"master weights must be FP32, found a {p.dtype} parameter of shape {tuple(p.shape)}")
    # foreach is the fast path on CPU and GPU and is bit-reproducible run to run.
    return torch.optim.AdamW(param_groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, foreach=True)
