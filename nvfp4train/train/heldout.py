"""Held-out evaluation during training: the mean next-token loss per held-out domain (train.eval_every and
the last step), in the training precision or, with train.eval_precision=bf16, with the precision linears
running their GEMMs in BF16."""

from __future__ import annotations

import contextlib

import torch

from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls


@contextlib.contextmanager
def bf16_linears(layers):
    """The precision linears `layers` run their GEMMs in BF16 inside the block (as after a full switch)."""
    saved = []
    for layer in layers:
        if isinstance(getattr(type(layer), "quantized", None), property):  # te backend: follows `switched`
            saved.append((layer, "switched", layer.switched))
            layer.switched = True
        else:  # QuantLinear: a plain flag its forward reads (False: F.linear under autocast)
            saved.append((layer, "quantized", layer.quantized))
            layer.quantized = False
    try:
        yield
    finally:
        for layer, attr, value in saved:
            setattr(layer, attr, value)


@torch.no_grad()
def evaluate(model, val_data: dict, micro_batch_size: int, device: torch.device, bf16_layers=()) -> dict[str, float]:
    """Mean next-token loss per held-out domain; the linears of `bf16_layers` run in BF16 meanwhile
    (train.eval_precision=bf16)."""
    with bf16_linears(bf16_layers):
        return _evaluate(model, val_data, micro_batch_size, device)


def _evaluate(model, val_data: dict, micro_batch_size: int, device: torch.device) -> dict[str, float]:
    was_training = model.training
    model.eval()
    out = {}
    for domain, seqs in val_data.items():
        total, count = torch.zeros((), device=device), 0
        for i in range(0, len(seqs), micro_batch_size):
            chunk = seqs[i : i + micro_batch_size].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16), cpu_bf16_matmuls(device):
                total += model(chunk[:, :-1], chunk[:, 1:], reduction="sum")  # FP32, chunked (model/loss.py)
            count += chunk[:, 1:].numel()
        out[f"val/{domain}"] = total.item() / max(count, 1)
    if out:
        out["val/mean"] = sum(out.values()) / len(out)
    model.train(was_training)
    return out
