"""What every engine gives the loop: one optimizer step's results (`StepStats`) and the `Engine` interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepStats:
    """One optimizer step's loss (mean over the global batch), gradient norm and whether the update
    was applied, as device tensors: the loop reads them on the host only when it logs (trainer.py)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    applied: torch.Tensor
