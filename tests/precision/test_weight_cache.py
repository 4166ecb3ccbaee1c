"""The quantized weight cache: each layer quantizes its weight once per optimizer step (the first
training forward) and every micro-batch's Fprop and Dgrad reuse it, with the same bits as
quantizing at every use; keyed on the weight epoch, which the optimizer's post-step hook, loads, precision
switches and `precision.weights_changed` bump."""

import pytest
import torch
from torch import nn

from nvfp4train.precision import (
    PrecisionController,
    QuantLinear,
    build_linear_factory,
    operands,
    pairs,
    weights_changed,
)
from nvfp4train.precision.controller import weights_changed_after_each_step
from nvfp4train.precision.ops import LayerState

from .helpers import count_weight_quantizations, load_preset

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


class _Fixture:
    """TwoLayers (NVFP4 everywhere) under a controller, a training forward + backward, and what a fresh model
    with the same state gives (every operand quantized anew)."""

    def __init__(self, preset="nvfp4"):
        self.policy = _policy(preset)
        torch.manual_seed(0)
        self.model = TwoLayers(build_linear_factory(self.policy, n_blocks=1, seed=5))
        self.ctl = PrecisionController(self.policy, self.model)
        self.x = torch.randn(40, 32, generator=torch.Generator().manual_seed(1))

    def train_forward(self, model=None):
        model = model or self.model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(self.x)
        y.float().square().mean().backward()
        return y.detach()

    def expected(self):
        fresh = TwoLayers(build_linear_factory(self.policy, n_blocks=1, seed=5))
        fresh.load_state_dict(self.model.state_dict())
        fresh.fc1.set_switched(self.model.fc1.switched)
        fresh.fc2.set_switched(self.model.fc2.switched)
        return self.train_forward(fresh)


def test_the_layers_of_a_factory_and_controller_share_one_epoch():
    f = _Fixture()
    assert f.model.fc1.weight_epoch is f.model.fc2.weight_epoch is f.ctl.weight_epoch
    # linears built one by one (their own epochs) are adopted into one
    single = [QuantLinear(8, 8, policy=f.policy, block_index=0, n_blocks=1, name=n) for n in ("fc1", "fc2")]
    assert single[0].weight_epoch is not single[1].weight_epoch
    ctl = PrecisionController(f.policy, nn.Sequential(*single))
    assert single[0].weight_epoch is single[1].weight_epoch is ctl.weight_epoch


def test_a_weight_changed_by_hand_is_quantized_again_after_weights_changed(monkeypatch):
    """The cache is keyed on the weight epoch alone, not on the weight's version counter or storage: an edit
    by hand is seen by an evaluation forward (never cached) and, after `precision.weights_changed(model)`, by
    training forwards."""
    f = _Fixture()
    calls = count_weight_quantizations(monkeypatch, f.model)
    before = f.train_forward()
    assert calls.count(("block0.fc1", "fprop_w")) == 1
    assert torch.equal(f.train_forward(), before)  # reused within the epoch: not quantized again
    assert calls.count(("block0.fc1", "fprop_w")) == 1
    with torch.no_grad():
        f.model.fc1.weight.mul_(0.5)  # in place: the version counter moves, the epoch does not
    assert torch.equal(f.train_forward(), before)  # the old epoch's operands: what the docs say to bump for
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        evaluated = f.model(f.x)
    assert torch.equal(evaluated, f.expected())  # evaluation never reads the cache
    value = f.ctl.weight_epoch.value
    weights_changed(f.model)
    assert f.ctl.weight_epoch.value == value + 1
    assert torch.equal(f.train_forward(), f.expected())
    assert calls.count(("block0.fc1", "fprop_w")) == 3  # the first training forward, the evaluation, the bump's


@pytest.mark.parametrize("fused", [False, True])
def test_the_optimizer_post_step_hook_starts_a_new_epoch(monkeypatch, fused):
    """An optimizer with the hook (what the training engine installs) needs no controller call: the step after
    it quantizes the updated weight once, and gives a fresh model's bits. torch's fused AdamW leaves the
    version counters as they were; the hook sees the step, not the weight."""
    f = _Fixture()
    calls = count_weight_quantizations(monkeypatch, f.model)
    optimizer = torch.optim.AdamW(f.model.parameters(), lr=0.1, fused=fused)
    weights_changed_after_each_step(optimizer, f.model)
    for _ in range(3):
        calls.clear()
        value = f.ctl.weight_epoch.value
        assert torch.equal(f.train_forward(), f.expected())
        f.train_forward()  # a second micro-batch: reuses the operands
        assert calls.count(("block0.fc1", "fprop_w")) == calls.count(("block0.fc2", "fprop_w")) == 1
        optimizer.step()
        optimizer.zero_grad()
        assert f.ctl.weight_epoch.value == value + 1 and not f.ctl.weight_epoch._entries  # freed at the step


def test_without_a_bump_an_optimizer_step_is_not_seen():
    """The control: the hook, not the weight's version counter, is what makes the step's weights seen."""
    f = _Fixture()
    optimizer = torch.optim.SGD(f.model.parameters(), lr=0.5)
    before = f.train_forward()
    optimizer.step()  # bumps the weights' version counters
    optimizer.zero_grad()
    assert torch.equal(f.train_forward(), before)
    f.ctl.weights_changed()
    assert not torch.equal(f.train_forward(), before)


def test_loading_weights_starts_a_new_epoch(monkeypatch):
    """model.load_state_dict (a checkpoint, eval, export) and the controller's load_state_dict bump the epoch."""
    f = _Fixture()
    calls = count_weight_quantizations(monkeypatch, f.model)
    f.train_forward()
    other = TwoLayers(build_linear_factory(f.policy, n_blocks=1, seed=5))  # other init weights
    value = f.ctl.weight_epoch.value
    f.model.load_state_dict(other.state_dict())
    assert f.ctl.weight_epoch.value > value and not f.ctl.weight_epoch._entries
    assert torch.equal(f.train_forward(), f.expected())
    assert calls.count(("block0.fc1", "fprop_w")) == 2
    value = f.ctl.weight_epoch.value
    f.ctl.load_state_dict(f.ctl.state_dict())
    assert f.ctl.weight_epoch.value > value and not f.ctl.weight_epoch._entries
    f.train_forward()
    assert calls.count(("block0.fc1", "fprop_w")) == 3


@pytest.mark.parametrize("mode", ["full", "backward_only", "forward_only"])
def test_a_precision_switch_starts_a_new_epoch(mode):
    """The mid-run switch changes the layers' recipes: the epoch is bumped (the old recipe's operands freed)
    and the next step runs the switched recipe's bits."""
    f = _Fixture()
    f.policy = load_preset("nvfp4", bf16_first=0, bf16_last=0, switch={"at_fraction": 0.5, "mode": mode})
    torch.manual_seed(0)
    f.model = TwoLayers(build_linear_factory(f.policy, n_blocks=1, seed=5))
    f.ctl = PrecisionController(f.policy, f.model)
    assert f.ctl.on_step(0.0) is None
    f.train_forward()
    assert f.ctl.weight_epoch._entries  # operands of the quantized recipe cached
    value = f.ctl.weight_epoch.value
    assert f.ctl.on_step(0.6) is not None  # the switch
    assert f.ctl.weight_epoch.value > value + 1  # on_step's bump and the recipes' own
    f.ctl.weights_changed()
    value = f.ctl.weight_epoch.value
    f.model.fc1.set_switched(True)  # the same recipe again: no new epoch
    assert f.ctl.weight_epoch.value == value
    assert torch.equal(f.train_forward(), f.expected())


def test_fresh_storage_at_every_use_is_cached_within_the_epoch(monkeypatch):
    """FSDP2 gathers the weight into fresh storage at every forward (and, resharded, in backward): the cache
    keys on the epoch, so one quantization per step still (tests/train/test_distributed_fsdp.py runs FSDP2)."""
    f = _Fixture()
    calls = count_weight_quantizations(monkeypatch, f.model)
    optimizer = torch.optim.SGD(f.model.parameters(), lr=0.5)
    weights_changed_after_each_step(optimizer, f.model)
    for _ in range(2):
        calls.clear()
        for _ in range(3):
            for layer in (f.model.fc1, f.model.fc2):  # a gather: the same values in new storage
                layer.weight.data = layer.weight.data.clone()
            f.train_forward()
        assert calls.count(("block0.fc1", "fprop_w")) == 1
        optimizer.step()
        optimizer.zero_grad()
    f.train_forward()
    optimizer.zero_grad()
    assert torch.equal(f.train_forward(), f.expected())


def test_a_weight_moved_or_cast_is_quantized_again(monkeypatch):
    """Beside the epoch, an entry is kept only for a weight of the same shape, dtype and device."""
    f = _Fixture()
    calls = count_weight_quantizations(monkeypatch, f.model)
    f.train_forward()
    f.model.fc1.weight.data = f.model.fc1.weight.data.double().float()[:, :]  # same form: reused
    f.train_forward()
    assert calls.count(("block0.fc1", "fprop_w")) == 1
    f.model.fc1.weight.data = f.model.fc1.weight.data.to(torch.bfloat16)
    f.train_forward()
    assert calls.count(("block0.fc1", "fprop_w")) == 2


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
