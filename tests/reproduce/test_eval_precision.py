"""train.eval_precision: with bf16 the in-training validation of an NVFP4 model runs its linears in BF16 (the
same losses as the same weights in a BF16 model), and the model is back in NVFP4 afterwards; with both it
writes a bf16 run's `val/*` and a train run's numbers as `val_tp/*`, and no evaluation changes training."""

from __future__ import annotations

import pytest
import torch
import yaml

from nvfp4train.config import CONFIG_DIR
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
from nvfp4train.train.heldout import evaluate, evaluate_as
from tests.conftest import read_metrics, run_train


def build(precision: str, **changes):
    model_cfg = ModelConfig.from_dict(yaml.safe_load((CONFIG_DIR / "model" / "hybrid_tiny.yaml").read_text()))
    section = yaml.safe_load((CONFIG_DIR / "precision" / f"{precision}.yaml").read_text())
    policy = PrecisionPolicy.from_dict(section | changes)
    torch.manual_seed(0)
    model = HybridLM(model_cfg, layer_factory=build_linear_factory(policy, len(model_cfg.pattern), seed=0))
    return model, PrecisionController(policy, model)


def test_bf16_evaluation_of_an_nvfp4_model():
    nvfp4, controller = build("nvfp4")
    bf16, _ = build("bf16")
    bf16.load_state_dict(nvfp4.state_dict())
    torch.manual_seed(1)
    val = {"a": torch.randint(0, 8192, (2, 33)), "b": torch.randint(0, 8192, (2, 33))}
    cpu = torch.device("cpu")
    in_bf16 = evaluate(nvfp4, val, 2, cpu, controller.layers)
    reference = evaluate(bf16, val, 2, cpu)
    in_nvfp4 = evaluate(nvfp4, val, 2, cpu)
    assert in_bf16 == reference
    assert in_nvfp4["val/mean"] != reference["val/mean"]
    assert any(layer.quantized for layer in controller.layers)  # restored after the evaluation
    assert evaluate(nvfp4, val, 2, cpu) == in_nvfp4


def held_out(records: list[dict], prefix: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith(prefix)} for r in records if "val/mean" in r]


TIMING = (
    "tokens_per_s",
    "step_time_s",
    "time_to_first_step_s",
    "checkpoint_time_s",
    "eval_time_s",
    "peak_mem_gib",
    "mfu",
)


@pytest.mark.slow  # three short training runs
def test_both_writes_a_bf16_runs_numbers_and_a_train_runs(tmp_path):
    """With SR on every operand, a quantized forward draws random bits: the evaluations in the training
    precision must give them back, or the steps after them (and the next BF16 evaluation) would differ."""
    runs = {}
    for eval_precision in ("bf16", "train", "both"):
        out = tmp_path / eval_precision
        run_train(
            f"out_dir={out}",
            "model=hybrid_tiny",
            "precision=nvfp4_sr_everywhere",
            "precision.stats_every=1",
            "train.max_steps=4",
            "train.seq_len=32",
            "train.global_batch_size=4",
            "train.log_every=1",
            "train.eval_every=2",
            "train.eval_sequences=2",
            "train.progress=false",
            f"train.eval_precision={eval_precision}",
        )
        runs[eval_precision] = read_metrics(out)
    bf16, train, both = runs["bf16"], runs["train"], runs["both"]
    assert [r["step"] for r in both if "val/mean" in r] == [2, 4]
    assert all(r["eval_time_s"] > 0 for run in runs.values() for r in run if "val/mean" in r)
    assert not any("eval_time_s" in r for run in runs.values() for r in run if "val/mean" not in r)
    # BF16 numbers bit for bit a bf16 run's, the training precision's a train run's
    assert held_out(both, "val/") == held_out(bf16, "val/")
    tp = [{"val/" + k[len("val_tp/") :]: v for k, v in r.items()} for r in held_out(both, "val_tp/")]
    assert tp == held_out(train, "val/") and tp != held_out(bf16, "val/")
    # and the runs themselves are one run: losses, gradients and quantization telemetry alike
    for a, b, c in zip(bf16, train, both, strict=True):
        keep = lambda r: {k: v for k, v in r.items() if not k.startswith(("val/", "val_tp/")) and k not in TIMING}  # noqa: E731
        assert keep(a) == keep(b) == keep(c)
        assert any(k.startswith("quant/") for k in keep(a))  # precision.stats_every=1
    log = (tmp_path / "both" / "train.log").read_text()
    line = next(x for x in log.splitlines() if "held-out loss at step 4" in x)
    assert "(in training, BF16 and training precision, up to 2 sequences per source)" in line
    v = both[-1]
    assert f"mean {v['val/mean']:.4f} (bf16) {v['val_tp/mean']:.4f} (nvfp4_sr_everywhere)" in line


def test_both_on_a_bf16_model_evaluates_once():
    model, controller = build("bf16")
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    val = {"a": torch.randint(0, 8192, (2, 33)), "b": torch.randint(0, 8192, (2, 33))}
    out = evaluate_as("both", model, val, 2, torch.device("cpu"), controller.layers)
    assert len(calls) == 2  # one forward per source: a single evaluation
    assert out == evaluate(model, val, 2, torch.device("cpu")) | {
        "val_tp/a": out["val/a"],
        "val_tp/b": out["val/b"],
        "val_tp/mean": out["val/mean"],
    }


def test_an_evaluation_in_the_training_precision_leaves_sr_streams_and_telemetry_alone():
    model, controller = build("nvfp4", sr="all")  # precision=nvfp4_sr_everywhere
    for layer in controller.layers:
        layer.stats_enabled = True
    val = {"a": torch.randint(0, 8192, (2, 33))}
    quantized = [layer for layer in controller.layers if layer.quantized]
    evaluate_as("train", model, val, 2, torch.device("cpu"), controller.layers)
    assert quantized and not any(layer.sr.state() for layer in quantized)  # the generators it made: dropped
    for layer in quantized:  # as training's first step makes them
        layer.sr_generators(torch.device("cpu"))
    streams = [dict(layer.sr.state()) for layer in quantized]
    assert all(streams)
    controller.quant_stats()
    first = evaluate_as("both", model, val, 2, torch.device("cpu"), controller.layers)
    for layer, before in zip(quantized, streams):
        after = layer.sr.state()
        assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert controller.quant_stats() == {} and all(layer.stats_enabled for layer in controller.layers)
    # rewound: the same SR bits again, so the same losses
    assert evaluate_as("both", model, val, 2, torch.device("cpu"), controller.layers) == first
    # and without the rewind, those bits would have moved on: the evaluation does draw them
    unkept = evaluate(model, val, 2, torch.device("cpu"))
    assert evaluate(model, val, 2, torch.device("cpu")) != unkept


def test_a_bad_eval_precision_is_refused_in_one_line(tmp_path):
    proc = run_train(f"out_dir={tmp_path / 'run'}", "model=hybrid_tiny", "train.eval_precision=fp4", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.eval_precision" in lines[0], proc.stderr
    assert all(word in lines[0] for word in ("train", "bf16", "both")) and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
