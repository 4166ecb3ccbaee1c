"""How one optimizer step runs, per engine: PyTorch (single process, DDP, FSDP2) or DeepSpeed ZeRO.

Both give the loop the same small interface:
    engine.train_step(micro_batches, lr, step) -> StepStats (device tensors: loss, grad_norm, applied)
    engine.save(ckpt_dir) / engine.load(ckpt_dir)       model weights + optimizer state
    engine.module                                       the model to evaluate
The loop stays the same whichever engine runs; checkpoint directories share one layout.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from nvfp4train import dist
from nvfp4train.model.blocks import Mamba2Mixer
from nvfp4train.optim import OptimConfig, build_optimizer
from nvfp4train.precision.controller import drop_weight_caches_after_each_step
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls
from nvfp4train.precision.linear import QuantLinear
from nvfp4train.schema import ConfigError
from nvfp4train.train import checkpoint
from nvfp4train.train.cuda_graph import DDP_WARMUP_STEPS, StepGraph, cuda_graph_blocker

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    """One optimizer step's loss (mean over the global batch), gradient norm and whether the update
    was applied, as device tensors: the loop reads them on the host only when it logs (trainer.py)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    applied: torch.Tensor


def _to_device(micro_batches, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """All micro-batches of the step to the device at once: on CUDA through pinned memory with
    asynchronous copies, so later micro-batches travel while the first one computes."""
    if device.type != "cuda":
        return [(x.to(device), y.to(device)) for x, y in micro_batches]
    return [
        (x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True))
        for x, y in micro_batches
    ]


def allow_a_compile_per_block(model: nn.Module) -> None:
    """Under FSDP2 the compiled forward breaks at each block's FSDP hooks, so each block's forward is a
    frame of its own, and one code object serves every block. A quantized linear passes its layer id
    to its custom ops as a constant, so each quantized block compiles its own entry: past dynamo's
    recompile limit (8 by default) the remaining blocks would run eagerly, the emulated quantizers
    op by op, and the step would be paced by the host. Raise the limits to cover every block (in
    both recipes of a BF16 switch)."""
    n_blocks = len(getattr(model, "blocks", ())) or 1
    config = torch._dynamo.config
    # (torch < 2.7 named them cache_size_limit and accumulated_cache_size_limit)
    for names, least in (
        (("recompile_limit", "cache_size_limit"), 2 * n_blocks + 8),
        (("accumulated_recompile_limit", "accumulated_cache_size_limit"), 16 * n_blocks + 64),
    ):
        name = next((n for n in names if hasattr(config, n)), None)
        if name is not None:
            setattr(config, name, max(getattr(config, name), least))


def resolve_compile(setting: str, device: torch.device, model: nn.Module | None = None) -> bool:
    """train.compile: auto compiles on CUDA only (on CPU compiling costs more than it saves); true on CPU
    is refused for a model with Mamba blocks, whose PyTorch SSD scan Inductor's CPU code gets wrong."""
    if (
        setting == "true"
        and device.type == "cpu"
        and model is not None
        and any(isinstance(m, Mamba2Mixer) for m in model.modules())
    ):
        raise ConfigError(
            f"train.compile=true: on CPU, torch {torch.__version__.split('+')[0]}'s compiled code for the Mamba "
            "blocks' SSD scan returns NaN (eager is right); allowed here: auto (compiles on CUDA only) or false"
        )
    return device.type == "cuda" if setting == "auto" else setting == "true"


def resolve_cuda_graph(
    setting: str,
    model: nn.Module,
    info: dist.DistInfo,
    parallel: str,
    activation_checkpointing: str = "none",
    fsdp_reshard: bool = False,
) -> bool:
    """train.cuda_graph: auto captures the step where it can (cuda_graph.cuda_graph_blocker), true
    refuses a run where it cannot, naming why. fsdp_reshard: FSDP2 reshards after forward (resolved)."""
    if setting == "false":
        return False
    blocker = cuda_graph_blocker(
        model,
        info.device,
        info.world_size,
        parallel,
        activation_checkpointing,
        explicit=setting == "true",
        fsdp_reshard=fsdp_reshard,
    )
    if blocker is None:
        return True
    if setting == "true":
        raise ConfigError(
            f"train.cuda_graph=true: cannot capture the step here: {blocker}; "
            f"allowed: auto (captures where it can) or false"
        )
    log.info("train.cuda_graph=auto: eager steps (%s)", blocker)
    return False


class TorchEngine:
    """FP32 master weights in the model, BF16 autocast compute, fused AdamW; DDP/FSDP2 for >1 rank.

    The step never waits for the device: the loss and gradient norm stay device tensors, and a
    non-finite one skips the update on the device (fused AdamW's `found_inf`, as torch.amp's
    GradScaler uses it: weights, moments and step count untouched). The host NonFiniteGuard replays
    the same decision from the values when the loop reads them (trainer.py)."""

    def __init__(
        self,
        model: nn.Module,
        groups: list[dict],
        optim_cfg: OptimConfig,
        parallel: str,
        info: dist.DistInfo,
        compile: bool = False,
        reshard_after_forward: bool | str = True,
        cuda_graph: bool = False,
        fsdp_prefetch: int = 1,
        ddp_bucket_cap_mb: int = 100,
        hsdp_shard_size: int = 0,
    ):
        self.model, self.info, self.parallel = model, info, parallel
        self.fsdp = parallel in ("fsdp2", "hsdp") and info.world_size > 1
        if self.fsdp:
            n_params = sum(p.numel() for p in model.parameters())
            reshard_after_forward, why = dist.resolve_reshard_after_forward(
                str(reshard_after_forward).lower(), n_params, info
            )
            log.info("FSDP2: %s; prefetch %d block(s)", why, fsdp_prefetch)
        # a DDP or FSDP2 step captured with its collectives (cuda_graph.py): its gradients stay where the
        # graph writes them (DDP's bucket views, FSDP2's sharded gradients)
        ddp_graph = cuda_graph and parallel == "ddp" and info.world_size > 1
        self.keep_grad_buffers = ddp_graph or (cuda_graph and self.fsdp)
        # FSDP2 swaps parameters: the optimizer is built after
        self.wrapped = dist.wrap_model(
            model,
            parallel,
            info,
            reshard_after_forward=bool(reshard_after_forward),
            prefetch=fsdp_prefetch,
            ddp_bucket_cap_mb=ddp_bucket_cap_mb,
            capturable=ddp_graph,
            hsdp_shard_size=hsdp_shard_size,
        )
        if self.fsdp and parallel == "hsdp":  # the layout as the sharded weights hold it
            weight = next(model.parameters())
            replicas, shard = weight.device_mesh.shape
            log.info(
                "HSDP: %d replica(s) of FSDP2 over %d rank(s) each (weights %s)", replicas, shard, weight.placements
            )
        self.reshard_after_forward = bool(reshard_after_forward) if self.fsdp else None
        self.optimizer = build_optimizer(groups(model), optim_cfg, fused=True)
        drop_weight_caches_after_each_step(self.optimizer, model)  # the fused AdamW does not bump versions
        self.fused_clipping = self.optimizer.fuses_clipping()
        if self.fsdp:  # FSDP2 gathers each weight afresh at every use: one quantization a step, not a use
            for layer in model.modules():
                if isinstance(layer, QuantLinear):
                    layer.keep_weight_cache_until_cleared()
        # Static shapes: a step's shapes are fixed, and a shape that does change (another batch or sequence
        # length) recompiles for it rather than turning the sequence length symbolic, which Inductor could not
        # lower for the SSD scan's chunking (torch 2.13: "cannot determine truth value of Relational").
        if compile and self.fsdp:
            allow_a_compile_per_block(model)
        self.forward = torch.compile(self.wrapped, dynamic=False) if compile else self.wrapped
        self.grad_clip = optim_cfg.grad_clip
        # Evaluation runs the uncompiled model: a held-out pass is a few dozen sequences, and through the
        # compiled one it compiled the whole forward again (grad mode is one of its guards) at every run's
        # first evaluation, tens of seconds on a GPU.
        self.module = self.wrapped
        # train.cuda_graph: forward + backward replayed as one CUDA graph (cuda_graph.py says what it keeps)
        self.step_graph = None
        if cuda_graph:
            self.step_graph = StepGraph(
                model,
                self.forward,
                self.autocast,
                info.device,
                warmup_steps=DDP_WARMUP_STEPS if ddp_graph else 2,
                sync_context=self._sync_context,
                distributed=self.keep_grad_buffers,
                reshard=(lambda: dist.reshard_fsdp(model)) if self.fsdp else None,
            )

    def autocast(self):
        return torch.autocast(self.info.device.type, dtype=torch.bfloat16)

    def train_step(self, micro_batches, lr: float, step: int) -> StepStats:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        n = len(micro_batches)
        batches = _to_device(micro_batches, self.info.device)
        loss_sum = self.step_graph.run(batches) if self.step_graph is not None else None
        graphed = loss_sum is not None
        if not graphed:
            loss_sum = torch.zeros((), device=self.info.device)
            # BF16 products as FP32 GEMMs on a CPU without BF16 instructions; a compiled step keeps Inductor's
            bf16_matmuls = cpu_bf16_matmuls(self.info.device, enabled=self.forward is self.wrapped)
            for i, (x, y) in enumerate(batches):
                with self._sync_context(last=i == n - 1), bf16_matmuls:
                    with self.autocast():
                        loss = self.forward(x, y)  # the model's fused, chunked cross-entropy (model/loss.py)
                    (loss / n).backward()
                loss_sum += loss.detach()
        loss_t = dist.all_reduce_mean(loss_sum / n, self.info)
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        if self.fused_clipping:
            # clip_grad_norm_'s norm and coefficient; the optimizer's kernel applies the coefficient as it reads
            # each gradient, instead of a pass that multiplies them all in place first
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
            self.optimizer.clip_coef = torch.clamp(max_norm / (grad_norm + 1e-6), max=1.0)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        applied = torch.isfinite(loss_t) & torch.isfinite(grad_norm)
        self.optimizer.found_inf = (~applied).float()
        self.optimizer.step()
        if not graphed:  # a graph's gradients keep their addresses; it zeroes them itself
            self.optimizer.zero_grad(set_to_none=not self.keep_grad_buffers)
        return StepStats(loss_t, grad_norm, applied)

    def after_evaluation(self) -> None:
        """An evaluation ran the model: with a captured FSDP2 step, free the weights its forward left gathered
        (replays gather into the graph's own memory; cuda_graph.py)."""
        if self.step_graph is not None and self.fsdp:
            dist.reshard_fsdp(self.model)

    def close(self) -> None:
        """Free the step's CUDA graph: NCCL destroys a communicator only once no graph holds its collectives
        (a DDP graph left alive hangs the process group's shutdown)."""
        if self.step_graph is not None:
            self.step_graph.release()

    def _sync_context(self, last: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if self.info.world_size == 1 or last:
            return contextlib.nullcontext()
        if self.parallel == "ddp":
            return self.wrapped.no_sync()
        return _fsdp_no_sync(self.wrapped)

    def state_is_finite(self) -> torch.Tensor:
        """This rank's weights and optimizer moments, all finite (a device bool)."""
        moments = [v for st in self.optimizer.state.values() for v in st.values()]
        return checkpoint.tensors_are_finite([*self.model.parameters(), *moments])

    def save(self, tmp_dir: Path) -> dict:
        return checkpoint.save_model_optim(tmp_dir, self.model, self.optimizer)

    def load(self, ckpt_dir: Path, meta: dict) -> None:
        checkpoint.load_model_optim(ckpt_dir, self.model, self.optimizer, meta)


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


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
    int() with base 10: '0a') before any op is built. Measured on 2x H200 (docs/results/resume_gpu.md):
    ZeRO-1/2 train with the variable set to "9.0"."""
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
        info: dist.DistInfo,
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
                loss_value = dist.all_reduce_mean(torch.stack(losses).mean(), self.info).item()
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

    def after_evaluation(self) -> None:
        """DeepSpeed's steps are not captured: nothing to free."""

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


def build_engine(model, groups, optim_cfg, train_cfg, info, grad_accum):
    model.set_activation_checkpointing(str(train_cfg.activation_checkpointing))
    if train_cfg.parallel == "deepspeed":
        return DeepSpeedEngine(
            model, groups, optim_cfg, train_cfg.zero_stage, grad_accum, train_cfg.micro_batch_size, info
        )
    reshard = str(train_cfg.fsdp_reshard_after_forward)
    n_params = sum(p.numel() for p in model.parameters())
    fsdp_reshard = (
        train_cfg.parallel in ("fsdp2", "hsdp") and dist.resolve_reshard_after_forward(reshard, n_params, info)[0]
    )
    return TorchEngine(
        model,
        groups,
        optim_cfg,
        train_cfg.parallel,
        info,
        compile=resolve_compile(str(train_cfg.compile), info.device, model),
        reshard_after_forward=reshard,
        fsdp_prefetch=train_cfg.fsdp_prefetch,
        ddp_bucket_cap_mb=train_cfg.ddp_bucket_cap_mb,
        hsdp_shard_size=train_cfg.hsdp_shard_size,
        cuda_graph=resolve_cuda_graph(
            str(train_cfg.cuda_graph),
            model,
            info,
            train_cfg.parallel,
            str(train_cfg.activation_checkpointing),
            fsdp_reshard,
        ),
    )


__all__ = [
    "StepStats",
    "TorchEngine",
    "DeepSpeedEngine",
    "build_engine",
    "deepspeed_arch_list",
    "import_deepspeed",
    "resolve_compile",
    "resolve_cuda_graph",
]
