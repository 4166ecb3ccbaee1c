"""The PyTorch engine: single process, DDP, FSDP2 and HSDP, with an optional captured step (cuda_graph.py)."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from nvfp4train.optim import OptimConfig, build_optimizer
from nvfp4train.parallel import DistInfo, all_reduce_mean, reshard_fsdp, wrap_model
from nvfp4train.precision.controller import weights_changed_after_each_step
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls
from nvfp4train.train import checkpoint
from nvfp4train.train.cuda_graph import DDP_WARMUP_STEPS, StepGraph
from nvfp4train.train.engines.base import StepStats

log = logging.getLogger(__name__)


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


# Inductor's hint, warned once per process when it compiles a graph with an FP32 mm/bmm on an sm_80+ GPU while
# torch.backends.cuda.matmul.fp32_precision is not "tf32" (torch/_inductor/compile_fx.py, _warn_tf32_disabled;
# fx_passes/fuse_attention.py has a variant for FP32 attention). A run's FP32 GEMMs are the PyTorch SSD scan's
# chunk products (model/ssd.py computes in FP32 whatever the input dtype); the linears run in BF16 under autocast
# or on quantized operands, which this setting does not touch. TF32 would round the scan's FP32 inputs to 10
# mantissa bits and change the bits of every run made so far, so matmuls stay IEEE FP32 (torch's default,
# "highest") and the hint is filtered, saying so once in train.log.
TF32_HINT = "TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled"


def keep_fp32_matmuls(device: torch.device) -> str | None:
    """Filter Inductor's TF32 hint (TF32_HINT) for this process, leaving torch's FP32 matmul precision as it is;
    the train.log line that says so on CUDA (None elsewhere, where Inductor never gives the hint)."""
    warnings.filterwarnings("ignore", message=re.escape(TF32_HINT))
    precision = torch.backends.cuda.matmul.fp32_precision
    if device.type != "cuda" or precision == "tf32":  # no hint to explain: none is given
        return None
    return (
        f"compile: FP32 matmuls stay FP32 (torch.backends.cuda.matmul.fp32_precision={precision!r}), so the SSD "
        "scan's FP32 products keep their bits; Inductor's hint to enable TF32 is filtered"
    )


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
        info: DistInfo,
        compile: bool = False,
        reshard_after_forward: bool = True,
        cuda_graph: bool = False,
        fsdp_prefetch: int = 1,
        ddp_bucket_cap_mb: int = 100,
        hsdp_shard_size: int = 0,
    ):
        """compile, reshard_after_forward, cuda_graph: decided (train/plan.py); hsdp_shard_size: ranks per
        shard group (0: the ranks of a node)."""
        self.model, self.info, self.parallel = model, info, parallel
        self.fsdp = parallel in ("fsdp2", "hsdp") and info.world_size > 1
        if self.fsdp:
            log.info("FSDP2: reshard_after_forward=%s; prefetch %d block(s)", reshard_after_forward, fsdp_prefetch)
        # a DDP or FSDP2 step captured with its collectives (cuda_graph.py): its gradients stay where the
        # graph writes them (DDP's bucket views, FSDP2's sharded gradients)
        ddp_graph = cuda_graph and parallel == "ddp" and info.world_size > 1
        self.keep_grad_buffers = ddp_graph or (cuda_graph and self.fsdp)
        # FSDP2 swaps parameters: the optimizer is built after
        self.wrapped = wrap_model(
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
        weights_changed_after_each_step(self.optimizer, model)  # a new weight epoch after every update
        self.fused_clipping = self.optimizer.fuses_clipping()
        # Static shapes: a step's shapes are fixed, and a shape that does change (another batch or sequence
        # length) recompiles for it rather than turning the sequence length symbolic, which Inductor could not
        # lower for the SSD scan's chunking (torch 2.13: "cannot determine truth value of Relational").
        if compile:
            # A process that trains several runs (a Hydra -m sweep, a benchmark) compiles each as a process of its
            # own would: dynamo compiles again for every new model, and past its recompile limit (8 entries) it
            # would run the later runs' steps eagerly, slower and with other bits.
            torch._dynamo.reset()
        if compile and self.fsdp:
            allow_a_compile_per_block(model)
        if compile:
            note = keep_fp32_matmuls(info.device)
            if note:
                log.info(note)
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
                reshard=(lambda: reshard_fsdp(model)) if self.fsdp else None,
            )

    def captured_at(self, start_step: int) -> int | None:
        """The step whose forward and backward are captured as a CUDA graph, for a process that starts after
        `start_step` (None: every step runs eagerly)."""
        return None if self.step_graph is None else start_step + self.step_graph.warmup_steps + 1

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
        loss_t = all_reduce_mean(loss_sum / n, self.info)
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
            reshard_fsdp(self.model)

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
