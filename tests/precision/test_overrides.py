"""backward_override (TE's: the backward GEMMs in BF16 on the original operands, or on the Fprop operands'
dequantized values) and forward_override (the paper's App. D: only Fprop in BF16), as recipe settings: what
each GEMM is given, that a small model trains under each, and the one-line refusals."""

import pytest
import torch

from nvfp4train.config.schema import ConfigError
from nvfp4train.precision.recipe import DEQUANTIZED_OPERAND

from .helpers import GemmSpy, inputs, load_preset, make_layer, run
from .test_compile import loss_and_grads
from .test_training import train

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def _spied(monkeypatch, policy):
    layer = make_layer(policy)
    x, grad = inputs()
    with GemmSpy().patch(monkeypatch) as spy:
        y, dx, dw = run(layer, x, grad)
    return (y, dx, dw), spy.operands(), layer.weight.detach(), grad


def test_high_precision_backward_keeps_nvfp4_forward_and_runs_dgrad_wgrad_on_the_originals(monkeypatch):
    (y0, dx0, dw0), _, _, _ = _spied(monkeypatch, load_preset("nvfp4"))
    (y, dx, dw), ops, w, grad = _spied(monkeypatch, load_preset("nvfp4", backward_override="high_precision"))
    assert torch.equal(y, y0), "Fprop is nvfp4's, bit for bit"
    assert not torch.equal(dx, dx0) and not torch.equal(dw, dw0)
    assert torch.equal(ops["dgrad_dy"], grad.double()) and torch.equal(ops["wgrad_dy"], grad.double().t())
    assert torch.equal(ops["dgrad_w"], w.to(torch.bfloat16).double().t())


def test_dequantized_backward_runs_on_the_forward_operands_values(monkeypatch):
    (y0, dx0, dw0), ops0, _, _ = _spied(monkeypatch, load_preset("nvfp4"))
    policy = load_preset("nvfp4", backward_override="dequantized")
    assert policy.quantized_recipe().dgrad_w == DEQUANTIZED_OPERAND == policy.quantized_recipe().wgrad_x
    (y, dx, dw), ops, w, grad = _spied(monkeypatch, policy)
    assert torch.equal(y, y0)
    assert not torch.equal(dx, dx0) and not torch.equal(dw, dw0)
    assert torch.equal(ops["dgrad_dy"], grad.double())
    # Fprop's quantized W and X, dequantized to BF16 and transposed: not the originals
    assert torch.equal(ops["dgrad_w"], ops0["fprop_w"].to(torch.bfloat16).double().t())
    assert torch.equal(ops["wgrad_x"], ops0["fprop_x"].to(torch.bfloat16).double().t())
    assert not torch.equal(ops["dgrad_w"], w.to(torch.bfloat16).double().t())


def test_forward_override_runs_fprop_in_bf16_and_keeps_the_backward_quantized(monkeypatch):
    y_bf16, _, _ = run(make_layer(load_preset("bf16")), *inputs())
    (y0, dx0, dw0), ops0, _, _ = _spied(monkeypatch, load_preset("nvfp4"))
    (y, dx, dw), ops, w, grad = _spied(monkeypatch, load_preset("nvfp4", forward_override="high_precision"))
    assert torch.equal(y, y_bf16) and not torch.equal(y, y0), "Fprop is BF16's"
    assert torch.equal(ops["fprop_w"], w.to(torch.bfloat16).double())
    assert torch.equal(ops["dgrad_dy"], ops0["dgrad_dy"]), "Dgrad's dY is nvfp4's"
    assert not torch.equal(ops["dgrad_dy"], grad.double())
    # a fixed dY, the same W and X: the backward is nvfp4's, bit for bit
    assert torch.equal(dx, dx0) and torch.equal(dw, dw0)


def test_dequantized_backward_compiles_to_the_eager_bits():
    """Fprop's extra output (the dequantized X) and Dgrad's re-read of Fprop's W go through the custom ops'
    fake registrations too."""
    policy = load_preset("nvfp4", backward_override="dequantized")
    eager, _ = loss_and_grads(policy, compile_model=False)
    compiled, _ = loss_and_grads(policy, compile_model=True)
    for (loss_e, grads_e), (loss_c, grads_c) in zip(eager, compiled):
        assert torch.equal(loss_e, loss_c) and all(torch.equal(a, b) for a, b in zip(grads_e, grads_c))


@pytest.fixture(scope="module")
def nvfp4_losses():
    return train("nvfp4")


@pytest.mark.parametrize(
    "override",
    [
        {"backward_override": "high_precision"},
        {"backward_override": "dequantized"},
        {"forward_override": "high_precision"},
    ],
)
def test_a_small_model_trains_under_each_override(override, nvfp4_losses):
    losses = train("nvfp4", **override)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-10:]) / 10 < 0.8 * losses[0], "the run must learn"
    assert losses != nvfp4_losses


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        ("bf16", {"backward_override": "high_precision"}, "precision.backward_override needs a quantized format"),
        ("bf16", {"forward_override": "high_precision"}, "precision.forward_override needs a quantized format"),
        (
            "nvfp4",
            {"backward_override": "dequantized", "forward_override": "high_precision"},
            "leaves no GEMM quantized",
        ),
        ("nvfp4_sr_everywhere", {"backward_override": "dequantized"}, "is not allowed with sr='all'"),
        ("nvfp4", {"backward_override": "fp32"}, "precision.backward_override"),
    ],
)
def test_override_refusals_are_one_line(preset, overrides, message):
    with pytest.raises(ConfigError) as info:
        load_preset(preset, **overrides)
    assert message in str(info.value) and "\n" not in str(info.value)
