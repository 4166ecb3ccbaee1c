"""One optimizer step's forward and backward passes as a CUDA graph (`train.cuda_graph`).

Why: an emulated low-precision linear launches many small kernels (quantize, RHT, dequantize, GEMM
epilogue) from Python, and at the model sizes a reproduction affords the host launching them, not the
GPU, sets the step time (docs/results/code-measurements.md).
Captured once, every later step is one `replay()`.

What is captured, for a step of n micro-batches: under DDP and FSDP2 the gradients zeroed in place, then per micro-batch
the forward under BF16 autocast, `(loss / n).backward()` and the loss summed. Gradient clipping and
the optimizer step stay eager (a few fused kernels, and the learning rate changes every step).

What must hold for a replay to be the eager step, and how it is kept:
- Static addresses: micro-batches are copied into static input buffers; on one GPU the captured backward
  assigns the gradients (the graph's memory, rewritten by every replay), under DDP and FSDP2 they exist
  before the capture and are accumulated in place; either way the optimizer sees the same `.grad` tensors
  every step.
- Stochastic rounding: every SR generator is registered with the graph. A replay draws from the
  generator's current offset and advances it by what the eager step advances it, so the SR bits and
  the generator states a checkpoint saves are an eager run's.
- The quantized-weight cache (precision/linear.py `WeightCache`) starts a new weight epoch before the capture,
  so the captured forward quantizes the weight itself (from the master weight's memory, which the optimizer
  updates in place), and another after it, so eager code never sees the graph's tensors.
- Python state the forward reads: a precision switch changes the layers' recipes (recapture);
  telemetry steps read statistics on the host inside the forward, so they run eagerly. On one process
  the graph is kept through such a step where the GPU has room for an eager step beside the graph's
  pool: the gradients the graph writes are detached for the eager step (which assigns its own) and handed
  back at the next replay. Elsewhere the graph and its memory are released and recaptured on the next step.
- The first `warmup_steps` steps of every new shape and recipe set run eagerly: mamba-ssm's autotuning,
  Triton compilation, torch.compile's recompilation after a precision switch (Inductor reads values on
  the host while compiling, which a capture forbids), cuBLAS workspaces and the lazily created SR
  generators happen outside a capture.

Under DDP (more than one rank) the gradient all-reduce is captured with the step, as torch's CUDA-graph
notes describe it: DDP built on a side stream (dist.wrap_model's `capturable`), its first 11 iterations
eager (DDP rebuilds its buckets and samples its runtime statistics there), the gradients kept as views
of DDP's buckets (zeroed in place, never set to None, so the all-reduce in the graph writes where the
optimizer reads), accumulation across micro-batches inside the capture under `no_sync` as in the eager
step, and the capture in the capturing thread's error mode, so NCCL's watchdog thread may query its
events meanwhile.

Under FSDP2 (and HSDP) the step is captured with its all-gathers and reduce-scatters (by `auto` too, as
torchtitan's trainer captures its FSDP2 steps): FSDP2 allocates each block's gathered weights while the
step runs, so during the capture they come from the graph's memory pool, and every replay gathers into the
same addresses. The sharded gradients exist before the capture (zeroed in place, never set to None) and
FSDP2 accumulates into them. A replay runs none of FSDP2's Python, which still holds what the last step it
saw run left: an evaluation's forward leaves gathered weights behind (every block's without resharding
after forward, the last block's and the root's with it), which an eager step would then use instead of
gathering the weights the replays have updated since, and which a capture would bake in. So every module is
resharded before a capture, before each eager step that follows a graph, and after each evaluation.
DeepSpeed runs its own hooks and optimizer: not captured.
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn as nn

from nvfp4train.precision.controller import bump_weight_epochs, quant_linears

log = logging.getLogger(__name__)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's (FSDP2's sharded gradient's) local tensor, the same memory; a tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


DDP_WARMUP_STEPS = 11  # torch's CUDA-graph notes: at least 11 DDP-enabled eager iterations before capture


def cuda_graph_blocker(
    facts,
    device: torch.device,
    world_size: int,
    parallel: str,
    activation_checkpointing: str,
    explicit: bool = False,
    fsdp_reshard: bool = False,
) -> str | None:
    """Why this run cannot capture its step as a CUDA graph, or None when it can. `explicit`: asked for
    with train.cuda_graph=true, which also captures DDP's BF16 steps and FSDP2 steps that reshard after
    forward; auto captures FSDP2's and HSDP's steps in any precision where the gathered weights are kept
    from forward to backward (`fsdp_reshard` False: resharding means memory comes first, and the graph's
    pool holds more) and DDP's where a linear is quantized (the host issues a BF16 DDP step faster than
    the GPU runs it; docs/distributed.md has the measurements). `facts`: the model's (train/plan.py's RunFacts:
    `quantized`, `te_layers`)."""
    if device.type != "cuda":
        return f"the device is {device.type}, not cuda"
    if parallel == "deepspeed":
        return "train.parallel=deepspeed (DeepSpeed's hooks and its optimizer step are not captured)"
    if world_size > 1 and parallel == "ddp" and not explicit and not facts.quantized:
        return (
            f"{world_size} ranks with train.parallel=ddp in BF16 (the host keeps ahead of the GPU there; "
            f"captured with train.cuda_graph=true)"
        )
    if world_size > 1 and parallel in ("fsdp2", "hsdp") and not explicit and fsdp_reshard:
        return (
            "FSDP2 reshards after forward to save memory, which a captured step's pool would take back; "
            "captured with train.cuda_graph=true"
        )
    if activation_checkpointing != "none":
        return f"train.activation_checkpointing={activation_checkpointing} (recomputation saves RNG states on the host)"
    if facts.te_layers:
        return "precision.backend=te (Transformer Engine's layers keep their own state)"
    return None


class StepGraph:
    """Forward + backward of a step's micro-batches, captured on first use and replayed after.

    `run(micro_batches)` returns the summed loss of the micro-batches (a fresh device tensor) with the
    gradients accumulated into `.grad`, or None when this step must run eagerly (the caller runs it;
    `release()` has then already freed the graph and set the gradients to None, or zeroed them under DDP)."""

    def __init__(
        self,
        model: nn.Module,
        forward,
        autocast,
        device: torch.device,
        warmup_steps: int = 2,
        sync_context=None,
        distributed: bool = False,
        reshard=None,
    ):
        """sync_context(last) -> the context a micro-batch's forward and backward run in (DDP's no_sync on
        all but the last); distributed: the step holds collectives (captured in thread-local mode, the
        gradients kept); reshard(): FSDP2's gathered weights freed, before a capture and an eager step."""
        self.model, self.forward, self.autocast, self.device = model, forward, autocast, device
        self.warmup_steps = warmup_steps
        self.sync_context = sync_context or (lambda last: contextlib.nullcontext())
        self.distributed = distributed
        self.reshard = reshard or (lambda: None)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers = quant_linears(model)  # the layers whose SR generators and weight caches a capture handles
        self.eager_steps: dict[tuple, int] = {}  # eager warm-up steps run per (shapes, recipes)
        self.captures = 0  # how many times a step was captured (tests and logs read it)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key = None
        self.static_batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.loss_sum: torch.Tensor | None = None
        self.grads: list[torch.Tensor | None] | None = None  # one process: the gradients the graph writes
        self.pool_bytes = 0  # what the capture reserved: an eager step beside the graph needs about as much

    # ------------------------------------------------------------------ per step
    def run(self, micro_batches) -> torch.Tensor | None:
        warm = self._shapes_and_recipes(micro_batches)
        warming = self.eager_steps.get(warm, 0) < self.warmup_steps
        if warming or any(m.stats_enabled for m in self.layers):
            if not warming and self._kept_through_eager_step(warm):
                for p in self.params:  # the eager step assigns gradients of its own
                    p.grad = None
            else:
                self.release()
            self.eager_steps[warm] = self.eager_steps.get(warm, 0) + 1
            return None
        key = (*warm, tuple(id(g) for g in self._sr_generators()))
        if key != self.key:
            self.release()
            self._capture(micro_batches, key)
        elif self.grads is not None:  # after an eager step the optimizer dropped its gradients: the graph's again
            for p, g in zip(self.params, self.grads):
                p.grad = g
        for (sx, sy), (x, y) in zip(self.static_batches, micro_batches):
            sx.copy_(x, non_blocking=True)
            sy.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.loss_sum.clone()  # the graph overwrites loss_sum at the next replay

    def _kept_through_eager_step(self, warm: tuple) -> bool:
        """Whether the graph stays for an eager step of its own shapes and recipes (a telemetry step): one
        process, and room on the GPU for the step's memory beside the graph's pool."""
        if self.graph is None or self.distributed or self.key is None or self.key[:2] != warm:
            return False
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached > 1.25 * self.pool_bytes

    def release(self) -> None:
        """Drop the graph, its memory and the gradients it writes into (an eager step follows)."""
        if self.graph is None:
            return
        torch.cuda.synchronize(self.device)
        self.graph.reset()
        self.graph = self.key = self.loss_sum = self.grads = None
        self.static_batches = []
        self.reshard()  # FSDP2's state is the capture's, not the replays' (see the module's notes)
        if self.distributed:  # DDP's bucket views and FSDP2's sharded gradients stay the gradients
            torch._foreach_zero_([_local(p.grad) for p in self.params if p.grad is not None])
        else:
            for p in self.params:
                p.grad = None
        torch.cuda.empty_cache()

    # ------------------------------------------------------------------ capture
    def _sr_generators(self) -> list[torch.Generator]:
        """Every SR generator the current recipes draw from, created now if a layer has not yet."""
        return [gen for layer in self.layers for gen in layer.sr_generators(self.device)]

    def _shapes_and_recipes(self, micro_batches) -> tuple:
        """What the captured graph depends on besides tensor contents, and what a recompilation follows:
        batch shapes and the layers' recipes (a precision switch changes them). The capture's key adds
        the generator objects (a resume re-creates them)."""
        shapes = tuple((tuple(x.shape), x.dtype, tuple(y.shape), y.dtype) for x, y in micro_batches)
        return shapes, tuple(m.recipe_key for m in self.layers)

    def _capture(self, micro_batches, key) -> None:
        n = len(micro_batches)
        self.static_batches = [(x.to(self.device).clone(), y.to(self.device).clone()) for x, y in micro_batches]
        if self.distributed:  # DDP's bucket views (FSDP2's DTensors) exist after any eager step
            for p in self.params:
                if p.grad is None:
                    raise RuntimeError(
                        f"train.cuda_graph: a parameter of shape {tuple(p.shape)} has no gradient to capture into"
                    )
            grads = [_local(p.grad) for p in self.params]
        else:
            # The first micro-batch's backward assigns each gradient (the tensor its last op wrote, in the graph's
            # pool; every replay rewrites it there), as an eager step does: no zeroing and no FP32 add per
            # parameter (docs/results/code-measurements.md).
            for p in self.params:
                p.grad = None
            grads = []
        generators = self._sr_generators()
        bump_weight_epochs(self.layers)
        self.reshard()  # FSDP2 gathers inside the capture, whatever an evaluation left gathered
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # the eager steps' cached blocks, for the graph's pool
        # said before the capture too: it runs the whole step once more, and train.log shows what a run waits on
        log.info("cuda graph: capturing the step (%d micro-batch%s) ...", n, "" if n == 1 else "es")
        reserved = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        for gen in generators:
            graph.register_generator_state(gen)
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local" if self.distributed else "global"):
                if grads:
                    torch._foreach_zero_(grads)
                loss_sum = torch.zeros((), device=self.device)
                for i, (x, y) in enumerate(self.static_batches):
                    with self.sync_context(last=i == n - 1):
                        with self.autocast():
                            loss = self.forward(x, y)
                        (loss / n).backward()
                    loss_sum += loss.detach()
        except Exception as e:
            raise RuntimeError(
                f"train.cuda_graph: capturing the training step as a CUDA graph failed "
                f"({type(e).__name__}: {e}); run with train.cuda_graph=false"
            ) from e
        finally:
            bump_weight_epochs(self.layers)
        self.graph, self.loss_sum, self.key = graph, loss_sum, key
        self.grads = None if self.distributed else [p.grad for p in self.params]
        self.pool_bytes = max(torch.cuda.memory_reserved(self.device) - reserved, 0)
        self.captures += 1
        log.info(
            "cuda graph: captured the step (%d micro-batch%s, %d SR generators; capture #%d)",
            n,
            "" if n == 1 else "es",
            len(generators),
            self.captures,
        )
