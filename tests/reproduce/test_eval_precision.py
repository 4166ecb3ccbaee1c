"""train.eval_precision=bf16: the in-training validation of an NVFP4 model runs its linears in BF16 (the
same losses as the same weights in a BF16 model), and the model is back in NVFP4 afterwards."""

from __future__ import annotations

import torch
import yaml

from nvfp4train.config import CONFIG_DIR
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
from nvfp4train.train.heldout import evaluate


def build(precision: str):
    model_cfg = ModelConfig.from_dict(yaml.safe_load((CONFIG_DIR / "model" / "hybrid_tiny.yaml").read_text()))
    policy = PrecisionPolicy.from_dict(yaml.safe_load((CONFIG_DIR / "precision" / f"{precision}.yaml").read_text()))
    torch.manual_seed(0)
    model = HybridLM(model_cfg, linear_factory=build_linear_factory(policy, len(model_cfg.pattern), seed=0))
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
