"""Held-out evaluation during training: the mean next-token loss per held-out domain (train.eval_every and
the last step), as train.eval_precision asks: in the training precision (train), with the precision linears
running their GEMMs in BF16 (bf16), or both (BF16 as `val/*`, the training precision as `val_tp/*`)."""

from __future__ import annotations

import torch

from nvfp4train.precision.controller import bf16_linears, quant_linears, training_state_kept, weights_quantized_once
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls


def runs_in_bf16(layers) -> bool:
    """Every precision linear of `layers` runs its GEMMs in BF16 now (a BF16 model, or after a full switch):
    its training-precision evaluation is its BF16 one."""
    return not any(layer.quantized for layer in layers)


@torch.no_grad()
def evaluate_as(eval_precision: str, model, val_data: dict, micro_batch_size: int, device: torch.device, layers):
    """The held-out losses of train.eval_precision, `layers` being the model's precision linears: train ->
    `val/*` in the training precision; bf16 -> `val/*` in BF16; both -> `val/*` in BF16 (the numbers a bf16
    run writes) and `val_tp/*` in the training precision, from one evaluation where every layer runs in
    BF16 anyway. The host reads the losses once, at the end."""
    if eval_precision == "bf16":
        return evaluate(model, val_data, micro_batch_size, device, layers)
    if eval_precision == "train":
        with training_state_kept(layers):
            return _losses(val_data, _sums(model, val_data, micro_batch_size, device))[0]
    with bf16_linears(layers):
        in_bf16 = _sums(model, val_data, micro_batch_size, device)
    if runs_in_bf16(layers):
        in_training_precision = in_bf16
    else:
        with training_state_kept(layers):
            in_training_precision = _sums(model, val_data, micro_batch_size, device)
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
