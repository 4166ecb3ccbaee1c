"""The DeepSpeed ZeRO-1/2 engine and the shims DeepSpeed needs here (its output to train.log, a parsable
TORCH_CUDA_ARCH_LIST, weights-only checkpoint loading, a rendezvous for a single process)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import socket
from pathlib import Path

import torch
import torch.nn as nn

from nvfp4train import parallel
from nvfp4train.config.schema import ConfigError
from nvfp4train.optim import OptimConfig
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls
from nvfp4train.train import checkpoint
from nvfp4train.train.engines.base import StepStats

log = logging.getLogger(__name__)


class _LogLines:
    """A stream whose lines become INFO records of the `deepspeed` logger (so: train.log, not the terminal)."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                logging.getLogger("deepspeed").info(line.rstrip())
        return len(text)

    def flush(self) -> None:
        pass


def deepspeed_arch_list(current: str | None, capability: tuple[int, int]) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's op builder can parse it: this GPU's arch when unset, and the
    arch-specific suffixes dropped ("9.0a" -> "9.0", "10.0f" -> "10.0"; "+PTX" kept).

    DeepSpeed's builder reads the variable (or torch's own arch list, which for torch's CUDA wheels
    holds "9.0a") with int() on each part and fails on the suffix (ValueError: invalid literal for
    int() with base 10: '0a') before any op is built. ZeRO-1/2 train with the variable set to "9.0"
    (docs/results/resume_gpu.md)."""
    if not current or not current.strip():
        return f"{capability[0]}.{capability[1]}"
    out = []
    for entry in current.replace(",", ";").replace(" ", ";").split(";"):
        if not entry:
            continue
        arch, ptx = (entry[:-4], "+PTX") if entry.upper().endswith("+PTX") else (entry, "")
        arch = arch.rstrip("abfABF") if "." in arch else arch
        if arch + ptx not in out:
            out.append(arch + ptx)
    return ";".join(out)


def _pin_cuda_arch_list(device: torch.device) -> None:
    """TORCH_CUDA_ARCH_LIST set to what DeepSpeed can parse, should it build an op (deepspeed_arch_list)."""
    before = os.environ.get("TORCH_CUDA_ARCH_LIST")
    after = deepspeed_arch_list(before, torch.cuda.get_device_capability(device))
    if after != before:
        os.environ["TORCH_CUDA_ARCH_LIST"] = after
        log.info("deepspeed: TORCH_CUDA_ARCH_LIST=%s (was %s)", after, before if before is not None else "unset")


@contextlib.contextmanager
def _deepspeed_output_to_log():
    """DeepSpeed prints its op builds and start-up notes (and its logger, created on import, binds stdout):
    they go to the run's log file, the terminal keeps the short banner."""
    with contextlib.redirect_stdout(_LogLines()):
        yield


def import_deepspeed():
    """The deepspeed module, or one line saying how to get it (its import fails on a broken install too)."""
    try:
        with _deepspeed_output_to_log():
            import deepspeed
    except Exception as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise ConfigError(
            f"train.parallel=deepspeed: deepspeed cannot be imported ({why}); pip install 'nvfp4train[deepspeed]'"
        ) from None
    return deepspeed


class DeepSpeedEngine:
    """DeepSpeed ZeRO-1/2 with BF16 weights and DeepSpeed's FP32 master copies and Adam moments.

    DeepSpeed owns gradient accumulation, clipping and the optimizer step. A non-finite loss is caught
    before the step boundary: the accumulated gradients are zeroed so the update is a no-op for the
    weights (Adam's moments still decay by beta, as a skipped step in Megatron does not).

    The optimizer is torch's AdamW (DeepSpeed's `torch_adam`), fused on CUDA as the PyTorch engine's
    is: DeepSpeed's own FusedAdam is compiled on first use (a JIT build needing nvcc and a parsable
    TORCH_CUDA_ARCH_LIST), which torch's CUDA wheels on Hopper do not give it.
    """

    def __init__(
        self,
        model: nn.Module,
        groups,
        optim_cfg: OptimConfig,
        zero_stage: int,
        grad_accum: int,
        micro_batch_size: int,
        info: parallel.DistInfo,
    ):
        deepspeed = import_deepspeed()
        _ensure_rendezvous_env()
        self.info = info
        on_cpu = info.device.type == "cpu"
        if not on_cpu:
            _pin_cuda_arch_list(info.device)
        config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": grad_accum,
            "train_batch_size": micro_batch_size * grad_accum * info.world_size,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": zero_stage},
            "gradient_clipping": optim_cfg.grad_clip,
            "optimizer": {
                "type": "AdamW",
                "params": {
                    "lr": optim_cfg.lr,
                    "betas": list(optim_cfg.betas),
                    "eps": optim_cfg.eps,
                    "weight_decay": optim_cfg.weight_decay,
                    "torch_adam": True,
                    **({} if on_cpu else {"fused": True}),
                },
            },
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        with _deepspeed_output_to_log():
            self.engine, self.optimizer, _, _ = deepspeed.initialize(
                model=model,
                model_parameters=groups(model),
                config=config,
                dist_init_required=not torch.distributed.is_initialized(),
            )
        self.engine.checkpoint_engine.load = load_deepspeed_file
        self.module = self.engine

    def train_step(self, micro_batches, lr: float, step: int) -> StepStats:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        n = len(micro_batches)
        losses = []
        for i, (x, y) in enumerate(micro_batches):
            x, y = x.to(self.engine.device), y.to(self.engine.device)
            with cpu_bf16_matmuls(self.engine.device):  # BF16 weights: BF16 products on a CPU too
                loss = self.engine(x, y)
                self.engine.backward(loss)
            losses.append(loss.detach())
            if i == n - 1:
                loss_value = parallel.all_reduce_mean(torch.stack(losses).mean(), self.info).item()
                if not math.isfinite(loss_value):
                    self.engine.optimizer.zero_grad()
            self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm_value = float(norm) if norm is not None and math.isfinite(loss_value) else math.nan
        as_tensor = lambda v: torch.tensor(v, device=self.engine.device)  # noqa: E731
        # DeepSpeed decides on the host (it reads the loss above); the same StepStats as TorchEngine's
        return StepStats(
            as_tensor(loss_value),
            as_tensor(norm_value),
            as_tensor(math.isfinite(loss_value) and math.isfinite(norm_value)),
        )

    def captured_at(self, start_step: int) -> int | None:
        """DeepSpeed's steps are not captured as a CUDA graph."""
        return None

    def after_evaluation(self) -> None:
        """DeepSpeed's steps are not captured: nothing to free."""

    def close(self) -> None:
        """Nothing to free: DeepSpeed's engine holds no CUDA graph (the process group is shut down once, after
        every run: parallel.shutdown)."""

    def state_is_finite(self) -> torch.Tensor:
        """This rank's BF16 weights, FP32 master partitions and Adam moments, all finite (a device bool)."""
        zero = self.engine.optimizer
        inner = getattr(zero, "optimizer", zero)
        tensors = [
            *self.engine.module.parameters(),
            *getattr(zero, "single_partition_of_fp32_groups", []),
            *(v for st in inner.state.values() for v in st.values()),
        ]
        return checkpoint.tensors_are_finite(tensors)

    def save(self, tmp_dir: Path) -> dict:
        self.engine.save_checkpoint(str(tmp_dir), tag="deepspeed", save_latest=False)
        return {"engine": "deepspeed"}

    def load(self, ckpt_dir: Path, meta: dict) -> None:
        if meta.get("engine") != "deepspeed":
            raise checkpoint.CheckpointError(
                f"{ckpt_dir} was written by the {meta.get('engine', 'torch')} engine; "
                "train.parallel=deepspeed resumes only DeepSpeed checkpoints"
            )
        path, _ = self.engine.load_checkpoint(str(ckpt_dir), tag="deepspeed", load_lr_scheduler_states=False)
        if path is None:
            raise checkpoint.CheckpointError(f"{ckpt_dir}/deepspeed: DeepSpeed could not load it")


def load_deepspeed_file(path: str, map_location=None):
    """DeepSpeed's files hold tensors, numbers, strings and four small DeepSpeed records: nothing else
    is unpickled (DeepSpeed's own loader uses weights_only=False); a refusal names the file."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return checkpoint.load_weights_only(
        Path(path), map_location, safe_globals=[LossScaler, ZeroStageEnum, fragment_address, argparse.Namespace]
    )


def _ensure_rendezvous_env() -> None:
    """DeepSpeed always wants a process group; give a single process one on a free local port."""
    if "MASTER_ADDR" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
