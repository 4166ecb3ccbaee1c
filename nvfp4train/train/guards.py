"""Guards against bad steps: non-finite loss/gradients (skip, count, halt) and loss spikes (log)."""

from __future__ import annotations

import math
from dataclasses import dataclass


class TrainingHalted(RuntimeError):
    """Too many non-finite steps in a row; the message says where and what to try."""


@dataclass
class NonFiniteGuard:
    max_in_row: int
    in_row: int = 0
    total_skipped: int = 0

    last_loss: float = math.nan
    last_grad_norm: float = math.nan

    def check(self, step: int, loss: float, grad_norm: float) -> bool:
        """True if the step may be applied; False if it must be skipped. Raises after max_in_row skips."""
        self.last_loss, self.last_grad_norm = loss, grad_norm
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_row = 0
            return True
        self.in_row += 1
        self.total_skipped += 1
        if self.in_row >= self.max_in_row:
            raise TrainingHalted(
                f"step {step}: {self.in_row} steps in a row had a non-finite loss or gradient "
                f"(loss={loss}, grad_norm={grad_norm}); halting. Lower optim.lr or keep more blocks in BF16 "
                f"(precision config)"
            )
        return False

    def state_dict(self) -> dict:
        return {"in_row": self.in_row, "total_skipped": self.total_skipped}

    def load_state_dict(self, d: dict) -> None:
        self.in_row, self.total_skipped = int(d["in_row"]), int(d["total_skipped"])


@dataclass
class SpikeDetector:
    """Flags a loss above `factor` x its exponential moving average, once the average has settled."""

    factor: float
    warmup: int = 20
    beta: float = 0.95
    ema: float = 0.0
    seen: int = 0
    spikes: int = 0

    def update(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return False
        spike = self.seen >= self.warmup and loss > self.factor * self.ema
        if spike:
            self.spikes += 1
        else:  # a spike does not pull the baseline up
            self.ema = loss if self.seen == 0 else self.beta * self.ema + (1 - self.beta) * loss
        self.seen += 1
        return spike

    def state_dict(self) -> dict:
        return {"ema": self.ema, "seen": self.seen, "spikes": self.spikes}

    def load_state_dict(self, d: dict) -> None:
        self.ema, self.seen, self.spikes = float(d["ema"]), int(d["seen"]), int(d["spikes"])
