"""Held-out evaluation during training: the mean next-token loss per held-out domain (train.eval_every and
the last step), as train.eval_precision asks: in the training precision (train), with the precision linears
running their GEMMs in BF16 (bf16), or both (BF16 as `val/*`, the training precision as `val_tp/*`)."""

from __future__ import annotations

import logging

import torch

from nvfp4train.precision.controller import bf16_linears, quant_linears, training_state_kept, weights_quantized_once
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls
from nvfp4train.precision.linear import QuantLinear
from nvfp4train.precision.recipe import FORWARD_ROLES

log = logging.getLogger(__name__)


def runs_in_bf16(layers) -> bool:
    """Every precision linear of `layers` runs its GEMMs in BF16 now (a BF16 model, or after a full switch):
    its training-precision evaluation is its BF16 one."""
    return not any(layer.quantized for layer in layers)


class HeldOutGraphs:
    """The held-out pass over every source, one CUDA graph per precision setting (BF16, or the layers'
    recipes as they are), captured at the second evaluation of a setting and replayed at every later one.

    Why: the pass is dozens of forwards of a small model, each launching hundreds of kernels from Python
    (the quantizers of every linear), so at a reproduction's sizes the host, not the GPU, sets its time.
    A replay runs the eager pass's kernels on the same shapes: the same losses, bit for bit.

    What a replay relies on: the held-out sequences stay on the device at fixed addresses for the whole run
    (train/build.py), the optimizer updates the weights in place, and each replay quantizes the weights
    afresh from them, as the eager pass does once per evaluation (`weights_quantized_once`). What it cannot
    replay runs eagerly: a pass with telemetry on, or one whose forward draws stochastic rounding (the eager
    pass rewinds those streams after it). The first pass of each setting is eager too, so that Triton's
    compilation and mamba-ssm's autotuning happen outside a capture. A graph keeps the memory of its pass (one
    forward's activations) for the rest of the run, so a pass is captured only while at least a quarter of
    the GPU's memory is free: a run that fills the GPU evaluates eagerly, as before."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seen: set[tuple] = set()
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, list[int]]] = {}
        self.captures = 0  # tests and logs read it
        self.failed: str | None = None  # why capturing failed once: every later pass runs eagerly

    @staticmethod
    def replayable(layers) -> bool:
        for layer in layers:
            if layer.stats_enabled:
                return False
            if isinstance(layer, QuantLinear) and layer.quantized:
                if any(getattr(layer.recipe, role).rounding == "sr" for role in FORWARD_ROLES):
                    return False
            elif not isinstance(layer, QuantLinear):  # Transformer Engine's layers keep their own state
                return False
        return True

    def sums(self, model, val_data: dict, micro_batch_size: int, layers) -> tuple[torch.Tensor, list[int]]:
        """`_sums` of the pass the layers' current setting runs, replayed where it can be."""
        if self.failed is not None or not self.replayable(layers):
            return _sums(model, val_data, micro_batch_size, self.device)
        key = (
            tuple((name, seqs.data_ptr(), tuple(seqs.shape)) for name, seqs in val_data.items()),
            micro_batch_size,
            tuple((layer.quantized, layer.recipe_key) for layer in layers),
        )
        if key not in self.seen:
            self.seen.add(key)
            return _sums(model, val_data, micro_batch_size, self.device)
        if key not in self.graphs and not self._room():
            return _sums(model, val_data, micro_batch_size, self.device)
        if key not in self.graphs:
            # the graphs of the recipes before a precision switch are not replayed again: their memory back
            recipes = tuple(recipe for _, recipe in key[2])
            self.graphs = {k: v for k, v in self.graphs.items() if tuple(r for _, r in k[2]) == recipes}
            try:
                self.graphs[key] = self._capture(model, val_data, micro_batch_size)
            except Exception as e:  # a pass that cannot be captured still evaluates, eagerly
                self.failed = f"{type(e).__name__}: {e}"
                log.warning("held-out evaluation: not captured as a CUDA graph (%s); it runs eagerly", self.failed)
                return _sums(model, val_data, micro_batch_size, self.device)
        graph, totals, counts = self.graphs[key]
        graph.replay()
        return totals, counts  # read (copied) by _losses before this graph replays again

    def _room(self) -> bool:
        free, total = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached >= total / 4

    def _capture(self, model, val_data, micro_batch_size):
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # a saver thread may use CUDA meanwhile
            totals, counts = _sums(model, val_data, micro_batch_size, self.device)
        self.captures += 1
        log.info("cuda graph: captured the held-out evaluation (capture #%d)", self.captures)
        return graph, totals, counts


@torch.no_grad()
def evaluate_as(
    eval_precision: str,
    model,
    val_data: dict,
    micro_batch_size: int,
    device: torch.device,
    layers,
    graphs: HeldOutGraphs | None = None,
):
    """The held-out losses of train.eval_precision, `layers` being the model's precision linears: train ->
    `val/*` in the training precision; bf16 -> `val/*` in BF16; both -> `val/*` in BF16 (the numbers a bf16
    run writes) and `val_tp/*` in the training precision, from one evaluation where every layer runs in
    BF16 anyway. The host reads the losses once, at the end. `graphs`: each pass replayed as a CUDA graph
    where it can be (HeldOutGraphs)."""

    def sums():
        if graphs is None:
            return _sums(model, val_data, micro_batch_size, device)
        return graphs.sums(model, val_data, micro_batch_size, layers)

    if eval_precision == "bf16":
        with bf16_linears(layers):
            return _losses(val_data, sums())[0]
    if eval_precision == "train":
        with training_state_kept(layers):
            return _losses(val_data, sums())[0]
    with bf16_linears(layers):
        in_bf16 = sums()
    if runs_in_bf16(layers):
        in_training_precision = in_bf16
    else:
        with training_state_kept(layers):
            in_training_precision = sums()
    out, tp = _losses(val_data, in_bf16, in_training_precision)
    out.update({f"val_tp/{key[4:]}": value for key, value in tp.items()})
    return out


@torch.no_grad()
def evaluate(model, val_data: dict, micro_batch_size: int, device: torch.device, bf16_layers=()) -> dict[str, float]:
    """Mean next-token loss per held-out domain; the linears of `bf16_layers` run in BF16 meanwhile
    (train.eval_precision=bf16)."""
    with bf16_linears(bf16_layers):
        sums = _sums(model, val_data, micro_batch_size, device)
    return _losses(val_data, sums)[0]


def _sums(model, val_data: dict, micro_batch_size: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """One pass over the held-out sequences (on `device` already, where the trainer keeps them: no copy then),
    each quantized weight quantized once for all its batches: per domain, the summed next-token loss (FP32, on
    the device; not read here) and the number of tokens."""
    was_training = model.training
    model.eval()
    totals, counts = [], []
    with weights_quantized_once(quant_linears(model)):
        for seqs in val_data.values():
            total, count = torch.zeros((), device=device), 0
            for i in range(0, len(seqs), micro_batch_size):
                chunk = seqs[i : i + micro_batch_size].to(device)
                with torch.autocast(device.type, dtype=torch.bfloat16), cpu_bf16_matmuls(device):
                    total += model(chunk[:, :-1], chunk[:, 1:], reduction="sum")  # FP32, chunked (model/loss.py)
                count += chunk[:, 1:].numel()
            totals.append(total)
            counts.append(count)
    model.train(was_training)
    return (torch.stack(totals) if totals else torch.zeros(0, device=device)), counts


def _losses(val_data: dict, *passes: tuple[torch.Tensor, list[int]]) -> list[dict[str, float]]:
    """The `val/*` losses of each pass (`_sums`), from one host read of all their sums."""
    sums = torch.cat([totals for totals, _ in passes]).tolist()
    out = []
    for k, (_, counts) in enumerate(passes):
        at = k * len(val_data)
        losses = {
            f"val/{domain}": sums[at + i] / max(count, 1) for i, (domain, count) in enumerate(zip(val_data, counts))
        }
        if losses:
            losses["val/mean"] = sum(losses.values()) / len(losses)
        out.append(losses)
    return out
