"""An evaluation quantizes each weight once (`weights_quantized_once`: an epoch of the evaluation's own), with
the losses of quantizing at every batch, bit for bit; training's cached operands are neither read nor replaced,
so a run's losses are the same with or without evaluations between its micro-batches and steps; the host reads
an evaluation's losses once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from nvfp4train.config import CONFIG_DIR
from nvfp4train.eval import harness
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.precision import PrecisionController, build_linear_factory
from nvfp4train.precision.controller import bf16_linears, training_state_kept, weights_changed_after_each_step
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls
from nvfp4train.train import heldout

from .helpers import count_weight_quantizations, load_preset

PRESETS = ("bf16", "fp8_tensorwise", "fp8_blockwise", "nvfp4")
CPU = torch.device("cpu")


def build(preset: str):
    model_cfg = ModelConfig.from_dict(yaml.safe_load((CONFIG_DIR / "model" / "hybrid_tiny.yaml").read_text()))
    policy = load_preset(preset)
    torch.manual_seed(0)
    model = HybridLM(model_cfg, layer_factory=build_linear_factory(policy, len(model_cfg.pattern), seed=0))
    return model, PrecisionController(policy, model)


def held_out_tokens():
    g = torch.Generator().manual_seed(1)
    return {"a": torch.randint(0, 8192, (3, 17), generator=g), "b": torch.randint(0, 8192, (3, 17), generator=g)}


@torch.no_grad()
def evaluate_per_batch(model, val_data, micro_batch_size, device):
    """train/heldout.py's `_evaluate` as it was: every batch's weights quantized afresh, copied to the device
    per batch, one host read per source."""
    was_training = model.training
    model.eval()
    out = {}
    for domain, seqs in val_data.items():
        total, count = torch.zeros((), device=device), 0
        for i in range(0, len(seqs), micro_batch_size):
            chunk = seqs[i : i + micro_batch_size].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16), cpu_bf16_matmuls(device):
                total += model(chunk[:, :-1], chunk[:, 1:], reduction="sum")
            count += chunk[:, 1:].numel()
        out[f"val/{domain}"] = total.item() / max(count, 1)
    if out:
        out["val/mean"] = sum(out.values()) / len(out)
    model.train(was_training)
    return out


def evaluate_as_per_batch(eval_precision, model, val_data, micro_batch_size, device, layers):
    """train/heldout.py's `evaluate_as` as it was, on `evaluate_per_batch`."""
    with bf16_linears(layers):
        in_bf16 = evaluate_per_batch(model, val_data, micro_batch_size, device)
    if eval_precision == "bf16":
        return in_bf16
    with training_state_kept(layers):
        in_training_precision = evaluate_per_batch(model, val_data, micro_batch_size, device)
    if eval_precision == "train":
        return in_training_precision
    return in_bf16 | {f"val_tp/{key[4:]}": value for key, value in in_training_precision.items()}


@torch.no_grad()
def heldout_losses_per_batch(model, val_data, batch_size, device):
    """eval/harness.py's `heldout_losses` as it was: every batch quantized afresh and read to the host."""
    out = {}
    for source, seqs in val_data.items():
        total, count = 0.0, 0
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i : i + batch_size].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16), cpu_bf16_matmuls(device):
                logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            count += chunk[:, 1:].numel()
        out[source] = {"loss": total / count, "ppl": math.exp(total / count), "tokens": count}
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_an_evaluation_gives_the_bits_of_quantizing_at_every_batch(preset):
    model, controller = build(preset)
    val = held_out_tokens()
    for p in ("train", "bf16", "both"):
        out = heldout.evaluate_as(p, model, val, 2, CPU, controller.layers)
        assert out == evaluate_as_per_batch(p, model, val, 2, CPU, controller.layers), p
    assert harness.heldout_losses(model, val, 2, CPU) == heldout_losses_per_batch(model, val, 2, CPU)
    assert heldout.evaluate(model, val, 2, CPU) == evaluate_per_batch(model, val, 2, CPU)
    if preset != "bf16":  # quantized: the comparisons above saw quantized weights
        assert out["val_tp/mean"] != out["val/mean"]


@pytest.mark.parametrize("preset", ["fp8_tensorwise", "fp8_blockwise", "nvfp4"])
def test_an_evaluation_quantizes_each_weight_once_and_keeps_nothing(preset, monkeypatch):
    model, controller = build(preset)
    quantized = [layer for layer in controller.layers if layer.quantized]
    assert quantized
    val = held_out_tokens()  # two sources of two batches each
    # a training forward first: its cached operands must come through the evaluation untouched
    tokens = torch.randint(0, 8192, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    epoch = controller.weight_epoch
    value, training_entries = epoch.value, dict(epoch._entries)
    assert training_entries
    seen = []
    attention = next(layer for layer in quantized if layer.name == "qkv")  # (an MLP's may run as one fused node)
    attention.register_forward_hook(lambda layer, *_: seen.append(layer.weight_cache.eval_epoch))

    calls = count_weight_quantizations(monkeypatch, model)
    heldout.evaluate_as("both", model, val, 2, CPU, controller.layers)
    assert sorted(calls) == sorted((layer.label, "fprop_w") for layer in quantized)  # once each, for 4 batches
    assert epoch.value == value and epoch._entries == training_entries  # the same operand objects
    assert all(v is training_entries[k] for k, v in epoch._entries.items())
    eval_epoch = seen[-1]
    assert eval_epoch is not None and not eval_epoch._entries  # freed when the evaluation ended
    assert all(layer.weight_cache.eval_epoch is None for layer in quantized)

    calls.clear()
    harness.heldout_losses(model, val, 2, CPU)  # the final evaluation's pass: the same, a fresh epoch
    assert sorted(calls) == sorted((layer.label, "fprop_w") for layer in quantized)
    assert seen[-1] is not eval_epoch and not seen[-1]._entries

    # a cache turned off (PrecisionController(cache_weights=False)) keeps nothing in an evaluation either
    PrecisionController(controller.policy, model, cache_weights=False)
    calls.clear()
    heldout.evaluate_as("train", model, val, 2, CPU, controller.layers)
    assert sorted(calls) == sorted((layer.label, "fprop_w") for layer in quantized for _ in range(4))
    PrecisionController(controller.policy, model)

    # a weight changed by hand (no bump) is seen by the next evaluation: nothing carries over between them
    with torch.no_grad():
        quantized[0].weight.mul_(0.5)
    assert heldout.evaluate_as("train", model, val, 2, CPU, controller.layers) == evaluate_per_batch(model, val, 2, CPU)


@pytest.mark.parametrize("evaluation", ["train", "both", "harness"])
def test_an_evaluation_reads_its_losses_to_the_host_once(evaluation, monkeypatch):
    model, controller = build("nvfp4")
    val = held_out_tokens()  # two sources of two batches each
    reads = []
    for name in ("item", "tolist", "cpu", "numpy"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda t, *a, real=real, name=name, **k: reads.append(name) or real(t, *a, **k)
        )
    if evaluation == "harness":
        harness.heldout_losses(model, val, 2, CPU)
    else:
        heldout.evaluate_as(evaluation, model, val, 2, CPU, controller.layers)
    assert reads == ["tolist"]


def train(preset: str, evaluate: bool, steps: int = 3, micro_batches: int = 2):
    """Losses and final weights of a short run; `evaluate`: an evaluation in the training precision at the start
    of every step, after every micro-batch's backward (inside the training epoch) and after every optimizer step."""
    model, controller = build(preset)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    weights_changed_after_each_step(optimizer, model)
    val = held_out_tokens()
    g = torch.Generator().manual_seed(3)
    losses = []
    for step in range(steps):
        controller.on_step(step / steps)
        if evaluate:  # before the step's first training forward: training must build its own operands
            heldout.evaluate_as("train", model, val, 2, CPU, controller.layers)
        for _ in range(micro_batches):
            tokens = torch.randint(0, 8192, (2, 17), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            losses.append(loss.detach())
            if evaluate:
                heldout.evaluate_as("train", model, val, 2, CPU, controller.layers)
        optimizer.step()
        optimizer.zero_grad()
        if evaluate:
            heldout.evaluate_as("train", model, val, 2, CPU, controller.layers)
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("preset", ["fp8_tensorwise", "fp8_blockwise", "nvfp4"])
def test_training_after_an_evaluation_is_training_without_it(preset):
    losses, weights = train(preset, evaluate=False)
    losses_e, weights_e = train(preset, evaluate=True)
    assert all(torch.equal(a, b) for a, b in zip(losses, losses_e, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_e, strict=True))
