"""The quantized weight cache: each layer quantizes its weight once per optimizer step (the first
training forward) and every micro-batch's Fprop and Dgrad reuse it, with the same bits as
quantizing at every use; it is dropped when the weight changes or the controller says so."""

import pytest
import torch
from torch import nn

from nvfp4train.precision import PrecisionController, build_linear_factory, operands, pairs
from nvfp4train.precision.ops import LayerState

from .helpers import load_preset

ALL_QUANTIZED = {"bf16_first": 0, "bf16_last": 0}


class TwoLayers(nn.Module):
    def __init__(self, factory):
        super().__init__()
        self.fc1 = factory.linear(32, 64, block_index=0, name="fc1")
        self.fc2 = factory.linear(64, 48, block_index=0, name="fc2")

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _policy(preset):
    return load_preset(preset, **ALL_QUANTIZED)


def _train(policy, cache: bool, monkeypatch=None, steps=2, micro_batches=3):
    """Losses, final weights and, per step, the weight-operand quantizations by (layer, role)."""
    torch.manual_seed(0)
    model = TwoLayers(build_linear_factory(policy, n_blocks=1, seed=5))
    ctl = PrecisionController(policy, model, cache_weights=cache)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    calls, depth = [], [0]
    if monkeypatch is not None:
        for method in ("pack", "quantize"):
            real = getattr(LayerState, method)

            def spy(state, role, x, spec, k_pad, real=real):
                if role.endswith("_w") and depth[0] == 0:  # quantize calls pack when telemetry is on
                    calls[-1].append((state.sr.label, role))
                depth[0] += 1
                try:
                    return real(state, role, x, spec, k_pad)
                finally:
                    depth[0] -= 1

            monkeypatch.setattr(LayerState, method, spy)
        real_pair = LayerState.quantize_with_transpose

        def spy_pair(state, role, x, spec, k_row, k_col):  # W and Wᵀ from one cast: counted as W's
            both = real_pair(state, role, x, spec, k_row, k_col)
            if both is not None:  # (None on telemetry steps: quantized one by one, counted there)
                calls[-1].append((state.sr.label, role))
            return both

        monkeypatch.setattr(LayerState, "quantize_with_transpose", spy_pair)
        real_tiles = LayerState.pack_with_transpose

        def spy_tiles(state, role, w, spec, k_row, k_col):  # 128x128 FP8 tiles of W and Wᵀ in one pass: W's
            both = real_tiles(state, role, w, spec, k_row, k_col)
            if both is not None:
                calls[-1].append((state.sr.label, role))
            return both

        monkeypatch.setattr(LayerState, "pack_with_transpose", spy_tiles)
        real_weight_pair = LayerState.quantize_weight_pair

        def spy_weight_pair(state, role, w, spec, k_row, k_col):  # a 4over6 weight's W and Wᵀ in one pass: W's
            both = real_weight_pair(state, role, w, spec, k_row, k_col)
            if both is not None:  # (None on telemetry steps)
                calls[-1].append((state.sr.label, role))
            return both

        monkeypatch.setattr(LayerState, "quantize_weight_pair", spy_weight_pair)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        ctl.on_step(step / steps)
        calls.append([])
        for _ in range(micro_batches):
            x = torch.randn(40, 32, generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad()
    return losses, [p.detach().clone() for p in model.parameters()], calls


@pytest.mark.parametrize(
    "preset",
    ["nvfp4", "nvfp4_no_2d", "nvfp4_sr_everywhere", "nvfp4_4over6", "mxfp4", "fp8_blockwise", "fp8_tensorwise"],
)
def test_cached_weights_give_the_same_bits_and_quantize_once_per_step(preset, monkeypatch):
    policy = _policy(preset)
    losses, weights, _ = _train(policy, cache=False)
    losses_c, weights_c, calls = _train(policy, cache=True, monkeypatch=monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(losses, losses_c))
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_c))
    recipe = policy.quantized_recipe()
    for step_calls in calls:
        if recipe.fprop_w.rounding == "sr":  # SR weights draw anew at every use: never cached
            assert step_calls.count(("block0.fc1", "fprop_w")) == 3
            continue
        # Fprop: once per step, not per micro-batch. Dgrad (fc2 only: fc1's input wants no gradient):
        # the Fprop bits transposed (16x16 / 128x128 tiles; per-tensor FP8's codes, from Fprop's cast),
        # else one quantization of Wᵀ per step.
        # (a 4over6 weight's Wᵀ is made with W, by one pass, not from W's bits)
        made_with_w = pairs.tensorwise_pair(recipe.fprop_w, recipe.dgrad_w) or pairs.four_over_six_weight_pair(
            recipe.fprop_w, recipe.dgrad_w
        )
        from_fprop = recipe.reuses_fprop_weight or (made_with_w and step_calls is not calls[0])  # step 0: telemetry
        assert step_calls.count(("block0.fc1", "fprop_w")) == 1
        assert step_calls.count(("block0.fc2", "fprop_w")) == 1
        assert step_calls.count(("block0.fc2", "dgrad_w")) == (0 if from_fprop else 1)
        assert ("block0.fc1", "dgrad_w") not in step_calls


def test_a_changed_weight_is_quantized_again(monkeypatch):
    policy = _policy("nvfp4")
    model = TwoLayers(build_linear_factory(policy, n_blocks=1, seed=5))
    ctl = PrecisionController(policy, model)
    x = torch.randn(40, 32)

    def forward(train=True):
        with torch.set_grad_enabled(train), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).detach()

    fresh = TwoLayers(build_linear_factory(policy, n_blocks=1, seed=5))

    def expected():
        fresh.load_state_dict(model.state_dict())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fresh(x).detach()

    forward()
    with torch.no_grad():
        model.fc1.weight.mul_(0.5)  # in place: the version counter moves, the cache notices
    assert torch.equal(forward(), expected())
    model.fc1.weight.data.copy_(model.fc1.weight.data * 0.5)  # through .data: no version bump
    assert torch.equal(forward(train=False), expected())  # evaluation never reads the cache
    ctl.weights_changed()  # what the trainer calls after optimizer.step()
    assert torch.equal(forward(), expected())


@pytest.mark.parametrize(
    "preset", ["nvfp4", "nvfp4_rht_everywhere", "mxfp4", "fp8_blockwise", "fp8_tensorwise", "bf16"]
)
def test_packed_shapes_are_what_pack_returns(preset):
    """The custom ops' fake implementations allocate the saved tensors from `packed_shapes`."""
    recipe = _policy(preset).quantized_recipe()
    for spec in (recipe.fprop_w, recipe.wgrad_x):
        rows, k = 256, 384
        packed = operands.pack(torch.randn(rows, k), spec, k)
        assert [(tuple(t.shape), t.dtype) for t in packed.tensors] == operands.packed_shapes(spec, packed.layout.shape)


def test_dgrad_uses_fprop_bits_when_the_weight_changed_in_between():
    """A weight changed through `.data` between forward and backward (autograd refuses an in-place
    change there): Dgrad still uses the bits Fprop used, as without the cache; after
    `weights_changed` the next forward quantizes the new weight."""
    policy = _policy("nvfp4")
    results = []
    for cache in (False, True):
        torch.manual_seed(0)
        model = TwoLayers(build_linear_factory(policy, n_blocks=1, seed=5))
        ctl = PrecisionController(policy, model, cache_weights=cache)
        x = torch.randn(40, 32, generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        model.fc2.weight.data.mul_(2.0)
        loss.backward()
        ctl.weights_changed()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x).detach()
        results.append((model.fc1.weight.grad.clone(), y))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize(("out_f", "in_f", "k_row", "k_col"), [(48, 32, 32, 48), (40, 72, 96, 64)])
def test_a_4over6_weight_pair_gives_the_two_separate_operands(out_f, in_f, k_row, k_col):
    """pairs.weight_pair (one pass) against operands.fake_quantize of W and of Wᵀ, padding included: the same
    bits, and None where the pair does not apply."""
    spec = _policy("nvfp4_4over6").quantized_recipe().fprop_w
    assert pairs.four_over_six_weight_pair(spec, spec)
    w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(3)) * torch.logspace(-2, 1, in_f)
    w_q, wt_q = pairs.weight_pair(w, spec, k_row, k_col)
    want_w = operands.fake_quantize(w, spec, k_row)
    want_wt = operands.fake_quantize(w.t(), spec, k_col).first_rows(in_f)
    for got, want in ((w_q, want_w), (wt_q, want_wt)):
        assert got.values.dtype == want.values.dtype and torch.equal(got.values, want.values)
        assert torch.equal(got.decode_scale, want.decode_scale)
    plain = _policy("nvfp4").quantized_recipe().fprop_w
    assert not pairs.four_over_six_weight_pair(plain, plain) and pairs.weight_pair(w, plain, k_row, k_col) is None
    assert pairs.weight_pair(w, spec, k_row, out_f - 1) is None
