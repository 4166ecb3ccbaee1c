"""What every engine gives the loop: one optimizer step's results (`StepStats`) and the `Engine` interface."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn


@dataclass
class StepStats:
    """One optimizer step's loss (mean over the global batch), gradient norm and whether the update
    was applied, as device tensors: the loop reads them on the host only when it logs (trainer.py)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    applied: torch.Tensor


class Engine(Protocol):
    """How the trainer drives one optimizer step, whichever engine runs it (TorchEngine, DeepSpeedEngine)."""

    module: nn.Module  # the model to evaluate (wrapped as the engine runs it)
    optimizer: Any  # its param_groups take the step's learning rate; its hyperparameters survive a resume

    def train_step(self, micro_batches, lr: float, step: int) -> StepStats:
        """Forward and backward over this rank's micro-batches, clipping and the update (skipped on the
        device when the loss or the gradient norm is not finite)."""
        ...

    def captured_at(self, start_step: int) -> int | None:
        """The step captured as a CUDA graph in a process that starts after `start_step`; None: all eager."""
        ...

    def after_evaluation(self) -> None:
        """An evaluation ran the model: free what it left behind."""
        ...

    def state_is_finite(self) -> torch.Tensor:
        """This rank's weights and optimizer state, all finite (a device bool)."""
        ...

    def save(self, tmp_dir: Path) -> dict:
        """Weights and optimizer state into `tmp_dir`; returns what meta.json records of the engine."""
        ...

    def load(self, ckpt_dir: Path, meta: dict) -> None:
        """Weights and optimizer state from a checkpoint this engine wrote."""
        ...

    def close(self) -> None:
        """Free what outlives the run otherwise (a captured step's graph)."""
        ...
