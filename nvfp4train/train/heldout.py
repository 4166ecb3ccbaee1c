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
    BF16 anyway."""
    if eval_precision == "bf16":
        return evaluate(model, val_data, micro_batch_size, device, layers)
    if eval_precision == "train":
        with training_state_kept(layers):
            return _evaluate(model, val_data, micro_batch_size, device)
    out = evaluate(model, val_data, micro_batch_size, device, layers)
    if runs_in_bf16(layers):
        in_training_precision = dict(out)
    else:
        with training_state_kept(layers):
            in_training_precision = _evaluate(model, val_data, micro_batch_size, device)
    out.update({f"val_tp/{key[4:]}": value for key, value in in_training_precision.items()})
    return out


@torch.no_grad()
def evaluate(model, val_data: dict, micro_batch_size: int, device: torch.device, bf16_layers=()) -> dict[str, float]:
    """Mean next-token loss per held-out domain; the linears of `bf16_layers` run in BF16 meanwhile
    (train.eval_precision=bf16)."""
    with bf16_linears(bf16_layers):
        return _evaluate(model, val_data, micro_batch_size, device)


def _evaluate(model, val_data: dict, micro_batch_size: int, device: torch.device) -> dict[str, float]:
    """One pass over the held-out sequences (on `device` already, where the trainer keeps them: no copy then),
    each quantized weight quantized once for all its batches, and the sums read to the host once."""
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
    sums = torch.stack(totals).tolist() if totals else []
    out = {f"val/{domain}": total / max(count, 1) for domain, total, count in zip(val_data, sums, counts)}
    if out:
        out["val/mean"] = sum(out.values()) / len(out)
    return out
