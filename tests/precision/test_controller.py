"""Factory, controller: BF16 block selection, mid-run switch, checkpoint state, telemetry."""

import io

import pytest
import torch
from torch import nn

from nvfp4train.precision import PrecisionController, QuantLinear, build_linear_factory

from .helpers import load_preset


class TinyStack(nn.Module):
    """n_blocks residual MLP blocks built through the linear factory (the model's protocol)."""

    def __init__(self, factory, n_blocks=4, d=32, hidden=64):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "fc1": factory.linear(d, hidden, block_index=i, name="fc1"),
                    "fc2": factory.linear(hidden, d, block_index=i, name="fc2"),
                }
            )
            for i in range(n_blocks)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block["fc2"](torch.relu(block["fc1"](x)))
        return x


def build(policy, n_blocks=4, seed=0, weight_seed=0):
    torch.manual_seed(weight_seed)
    model = TinyStack(build_linear_factory(policy, n_blocks, seed), n_blocks)
    return model, PrecisionController(policy, model)


def step(model, x, grad):
    model.zero_grad()
    xx = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(xx)
    y.backward(grad.to(y.dtype))
    return y.detach(), xx.grad.detach(), [p.grad.clone() for p in model.parameters()]


def data(seed=0, tokens=64, d=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, d, generator=g), torch.randn(tokens, d, generator=g)


def test_factory_builds_bf16_blocks_by_index_and_validates_names():
    policy = load_preset("nvfp4", bf16_first=1, bf16_last=2)
    model, ctl = build(policy, n_blocks=6)
    kinds = [block["fc1"].recipe.all_bf16 for block in model.blocks]
    assert kinds == [True, False, False, False, True, True]
    assert len(ctl.layers) == 12 and ctl.backend_name == "emulated"
    assert all(isinstance(m, QuantLinear) and m.weight.dtype == torch.float32 for m in ctl.layers)
    factory = build_linear_factory(policy, 6, 0)
    with pytest.raises(ValueError, match="name='proj'"):
        factory.linear(8, 8, block_index=0, name="proj")
    with pytest.raises(ValueError, match="block_index=6"):
        factory.linear(8, 8, block_index=6, name="fc1")


@pytest.mark.parametrize("mode", ["full", "forward_only", "backward_only"])
def test_mid_run_switch_changes_numerics_from_that_step_on(mode):
    """One linear layer, so Y shows the forward numerics alone and dX (= Q(dY) Q(W)) the backward's."""
    policy = load_preset("nvfp4_all_layers", switch={"at_fraction": 0.5, "mode": mode})

    def single(policy):
        torch.manual_seed(0)
        layer = build_linear_factory(policy, 1, 0).linear(32, 48, block_index=0, name="fc1")
        return layer, PrecisionController(policy, layer)

    model, ctl = single(policy)
    reference, _ = single(load_preset("bf16"))
    x, grad = data(d=32)
    grad = grad.repeat(1, 2)[:, :48]
    bf16 = step(reference, x, grad)

    assert ctl.on_step(0.25) is None
    before = step(model, x, grad)
    assert ctl.on_step(0.49) is None
    assert torch.equal(step(model, x, grad)[0], before[0])  # same numerics until the switch
    message = ctl.on_step(0.5)
    assert message and mode in message and "0.5" in message
    after = step(model, x, grad)
    assert ctl.on_step(0.75) is None  # switches once

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    fwd_bf16 = rel(after[0], bf16[0]) < 0.01
    # dx of the quantized-backward run differs from BF16 even with a BF16 forward.
    bwd_bf16 = rel(after[1], bf16[1]) < 0.01
    assert (fwd_bf16, bwd_bf16) == {
        "full": (True, True),
        "forward_only": (True, False),
        "backward_only": (False, True),
    }[mode]
    assert rel(before[0], bf16[0]) > 0.02 and rel(before[1], bf16[1]) > 0.02
    if mode == "full":  # every linear is F.linear again: bit-identical to the BF16 model
        assert torch.equal(after[0], bf16[0]) and all(torch.equal(a, b) for a, b in zip(after[2], bf16[2]))


def test_state_dict_resumes_switch_and_sr_streams_exactly():
    policy = load_preset("nvfp4_all_layers", switch={"at_fraction": 0.5, "mode": "forward_only"}, stats_every=3)
    x, grad = data()
    model, ctl = build(policy, seed=11)
    for frac in (0.2, 0.6):
        ctl.on_step(frac)
        step(model, x, grad)
    buffer = io.BytesIO()
    torch.save(ctl.state_dict(), buffer)
    ctl.on_step(0.7)
    continued = step(model, x, grad)

    resumed_model, resumed = build(policy, seed=11)
    resumed_model.load_state_dict(model.state_dict())
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.switched and resumed.switched_at == pytest.approx(0.6) and resumed.steps == 2
    assert all(layer.switched for layer in resumed.layers)
    assert resumed.on_step(0.7) is None  # already switched: no second message
    replay = step(resumed_model, x, grad)
    assert all(torch.equal(a, b) for a, b in zip(continued[2], replay[2]))  # same SR draws

    fresh_model, fresh = build(policy, seed=11)  # without the state: different SR draws
    fresh_model.load_state_dict(model.state_dict())
    fresh.on_step(0.7)
    assert not all(torch.equal(a, b) for a, b in zip(continued[2], step(fresh_model, x, grad)[2]))


def test_quant_stats_every_n_steps_with_sane_values():
    policy = load_preset("nvfp4", stats_every=2)
    model, ctl = build(policy, n_blocks=8)  # nvfp4 fractions on 8 blocks: last 1 in BF16
    x, grad = data()
    ctl.on_step(0.0)
    step(model, x, grad)
    stats = ctl.quant_stats()
    assert ctl.quant_stats() == {}  # cleared by the read
    layers = {k.split("/")[1] for k in stats}
    assert layers == {f"block{i}.{n}" for i in range(7) for n in ("fc1", "fc2")}  # block7 is BF16
    roles = {k.split("/")[2] for k in stats}
    assert roles == {"fprop_x", "fprop_w", "dgrad_dy", "wgrad_dy", "wgrad_x"}  # dgrad_w reuses fprop_w
    for key, value in stats.items():
        assert key.startswith("quant/") and 0.0 <= value <= 1.0, (key, value)
    rel = [v for k, v in stats.items() if k.endswith("/rel_err")]
    assert all(0.03 < v < 0.3 for v in rel)
    ctl.on_step(0.1)
    step(model, x, grad)
    assert ctl.quant_stats() == {}  # not a stats step
    ctl.on_step(0.2)
    step(model, x, grad)
    assert ctl.quant_stats().keys() == stats.keys()


def test_quant_stats_see_flushed_values_and_underflowing_scales():
    """A tensor with one huge outlier: the global scale maps it to the top, so the other blocks'
    scales underflow E4M3's normal range and their small values flush to zero."""
    policy = load_preset("nvfp4_all_layers", stats_every=1)
    model, ctl = build(policy, n_blocks=1)
    x, grad = data()
    x[0, 0] = 1e6
    ctl.on_step(0.0)
    step(model, x, grad)
    stats = ctl.quant_stats()
    assert stats["quant/block0.fc1/fprop_x/scale_uflow"] > 0.9
    assert stats["quant/block0.fc1/fprop_x/flush_zero"] > 0.5
    assert stats["quant/block0.fc1/fprop_w/flush_zero"] < 0.1
