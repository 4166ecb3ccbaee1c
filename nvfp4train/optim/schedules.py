"""Learning-rate schedules as pure functions of the step.

WSD (warmup-stable-decay) follows Megatron-LM's `--lr-decay-style WSD`: linear warmup to the peak,
constant, then a decay over the last `decay_fraction` of the steps down to `min_lr`, in one of
Megatron's four shapes (`--lr-wsd-decay-style`). The paper trains its 12B model with WSD, decaying
over the last 20% to 1% of the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from nvfp4train.config.schema import bounded, check

Schedule = StrEnum("Schedule", "wsd cosine constant")
DecayStyle = StrEnum("DecayStyle", "linear cosine exponential minus_sqrt")
SCHEDULES = tuple(Schedule)
DECAY_STYLES = tuple(DecayStyle)


@dataclass(frozen=True)
class ScheduleConfig:
    name: Schedule = Schedule.wsd
    """wsd (warmup, constant, decay) | cosine (warmup, cosine to min_lr) | constant (warmup, then the peak)."""
    warmup_steps: int = bounded(20, ge=0)
    """Linear warmup from 0 to the peak over this many steps."""
    decay_fraction: float = bounded(0.2, ge=0.0, le=1.0)
    """WSD: decay over the last fraction of the steps (the paper: 15-20%)."""
    decay_style: DecayStyle = DecayStyle.linear
    """WSD decay shape, as Megatron-LM's --lr-wsd-decay-style."""

    def __post_init__(self):
        check(self, "optim.schedule")


def decay_coefficient(style: str, ratio: float) -> float:
    """Fraction of (peak - min) still applied after `ratio` in [0, 1] of the decay phase."""
    ratio = min(max(ratio, 0.0), 1.0)
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "exponential":
        return 2.0 * 0.5**ratio - 1.0
    if style == "minus_sqrt":
        return 1.0 - math.sqrt(ratio)
    raise ValueError(f"unknown decay style {style!r}: allowed {', '.join(DECAY_STYLES)}")


def lr_at(step: int, total_steps: int, peak_lr: float, min_lr: float, cfg: ScheduleConfig) -> float:
    """Learning rate for optimizer step `step` (0-based) of a run of `total_steps` steps."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return peak_lr * (step + 1) / cfg.warmup_steps
    if cfg.name == "constant":
        return peak_lr
    if cfg.name == "cosine":
        span = max(total_steps - cfg.warmup_steps, 1)
        return min_lr + decay_coefficient("cosine", (step - cfg.warmup_steps) / span) * (peak_lr - min_lr)
    # WSD: the decay phase covers the last `decay_fraction` of all steps (and never the warmup).
    decay_steps = max(int(round(cfg.decay_fraction * total_steps)), 0)
    decay_start = max(total_steps - decay_steps, cfg.warmup_steps)
    if decay_steps == 0 or step < decay_start:
        return peak_lr
    # (step + 1) so that the last step lands exactly on min_lr, as Megatron's 1-based counter does.
    ratio = (step + 1 - decay_start) / max(total_steps - decay_start, 1)
    return min_lr + decay_coefficient(cfg.decay_style, ratio) * (peak_lr - min_lr)
