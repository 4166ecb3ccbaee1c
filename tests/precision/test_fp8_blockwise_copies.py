"""Blockwise FP8 without per-step copies, with the bits of the copying path:

* the weight: Fprop's 128x128 tiles of W and Dgrad's Wᵀ (the same tiles transposed, K padded) from one pass
  (`pairs.weight_and_transpose`) equal `operands.pack` + `ops._transposed_weight`, ragged shapes included, at
  the K widths of both backends (emulated: multiples of 128; scaled_mm: 512);
* a Mamba in_proj's output (`strided_output`): Y returned as the first out_features columns of the GEMM's
  N-padded buffer, the layout the op's fake promises, with the values of the contiguous copy.

On CPU the scaled_mm backend runs the emulated GEMM (its operands at scaled_mm's K widths): the output then
comes back contiguous and the op puts it into the promised layout; on a GPU the GEMM's own buffer is returned
(tests/gpu/test_fp8_copies_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from nvfp4train.precision import PrecisionController, QuantLinear, operands, ops, pairs
from nvfp4train.precision.backends import gemm_out_width

from .helpers import inputs, load_preset, make_layer, run

ALL_QUANTIZED = {"bf16_first": 0, "bf16_last": 0, "stats_every": 0}  # no telemetry steps: they quantize apart


def _recipe(**overrides):
    return load_preset("fp8_blockwise", **ALL_QUANTIZED, **overrides).quantized_recipe()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a.view(torch.int32), b.view(torch.int32))  # FP32 scales, bit for bit


@pytest.mark.parametrize("backend", ["emulated", "scaled_mm"])
@pytest.mark.parametrize("out_f, in_f", [(200, 300), (388, 64), (256, 128), (129, 640)])
@pytest.mark.parametrize("pow2", [True, False])
def test_weight_and_its_transpose_in_one_pass_are_the_bits_of_the_copying_path(backend, out_f, in_f, pow2):
    recipe = _recipe(fp8_pow2_scales=pow2)
    assert recipe.reuses_fprop_weight
    spec = recipe.fprop_w
    k_f, k_d = ops._fprop_k(in_f, recipe, backend), ops._dgrad_k(out_f, recipe, backend)
    w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(out_f + in_f)) * 0.05
    w[:128, :128] *= 1e-3  # tiles with different scales
    w[-1, -1] = 40.0

    packed = operands.pack(w, spec, k_f)
    transposed = ops._transposed_weight(packed.dequantize(), in_f, k_d)
    got = pairs.weight_and_transpose(w, spec, k_f, k_d)
    assert got is not None
    got_packed, got_t = got
    assert got_packed.layout == packed.layout
    assert all(_same(a, b) for a, b in zip(got_packed.tensors, packed.tensors))
    assert _same(got_t.fp8_data, transposed.fp8_data) and _same(got_t.fp8_scales, transposed.fp8_scales)
    assert got_t.rows == transposed.rows == in_f and got_t.spec == transposed.spec
    assert got_t.fp8_data.is_contiguous() and got_t.fp8_scales.is_contiguous()
    # ... and the GEMM operand they make: Dgrad's dense Wᵀ is Fprop's dense W transposed
    assert torch.equal(got_t.values[:, :out_f], packed.dequantize().values[:out_f, :in_f].t())


def test_other_weight_specs_are_left_to_the_separate_quantizer():
    recipe = _recipe(weight_tile="1x128")
    assert pairs.weight_and_transpose(torch.randn(200, 300), recipe.fprop_w, 384, 256) is None
    nvfp4 = load_preset("nvfp4", **ALL_QUANTIZED).quantized_recipe()
    assert pairs.weight_and_transpose(torch.randn(64, 64), nvfp4.fprop_w, 64, 64) is None


def _train_layer(cache: bool, backend: str, steps=2, micro_batches=2):
    """Losses, outputs, input and weight gradients of a ragged layer (out 200, in 300) over a few steps."""
    policy = load_preset("fp8_blockwise", **ALL_QUANTIZED)
    layer = make_layer(policy, in_f=300, out_f=200, backend=backend)
    ctl = PrecisionController(policy, layer, cache_weights=cache)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    results = []
    for step in range(steps):
        ctl.on_step(step / steps)
        for micro in range(micro_batches):
            results.extend(run(layer, *inputs(tokens=136, in_f=300, out_f=200, seed=10 * step + micro)))
        optimizer.step()
        ctl.weights_changed()
    return results


@pytest.mark.parametrize("backend", ["emulated", "scaled_mm"])
def test_a_layer_with_the_one_pass_weight_trains_with_the_copying_paths_bits(backend, monkeypatch):
    """With the weight cache (the trainer's default) Dgrad takes Wᵀ from the pass that made Fprop's W; without
    it, Fprop's W transposed by a copy: the same Y, dX and dW at every step."""
    made = []
    real = pairs.weight_and_transpose

    def spy(*args):
        out = real(*args)
        made.append(out is not None)
        return out

    monkeypatch.setattr(pairs, "weight_and_transpose", spy)
    transposed = []
    real_t = ops._transposed_weight
    monkeypatch.setattr(ops, "_transposed_weight", lambda *a: transposed.append(1) or real_t(*a))
    cached = _train_layer(cache=True, backend=backend)
    assert made == [True, True] and not transposed  # once per step, and no transposing copy
    copying = _train_layer(cache=False, backend=backend)
    assert transposed
    assert all(torch.equal(a, b) for a, b in zip(cached, copying))


# ------------------------------------------------------------------------------ the ragged in_proj output
def _ragged_layer(strided: bool, backend="scaled_mm"):
    layer = make_layer(load_preset("fp8_blockwise", **ALL_QUANTIZED), in_f=256, out_f=200, backend=backend)
    layer.strided_output = strided
    return layer


def test_out_width_is_the_padded_n_of_scaled_mms_fp8_gemms():
    r = _recipe()
    assert gemm_out_width("scaled_mm", r.fprop_x, r.fprop_w, 10304) == 10368  # hybrid_1b's in_proj: 81 tiles
    assert gemm_out_width("emulated", r.fprop_x, r.fprop_w, 10304) == 10304
    assert gemm_out_width("scaled_mm", r.fprop_x, _recipe(weight_tile="1x128").fprop_w, 200) == 208
    t = load_preset("fp8_tensorwise", **ALL_QUANTIZED).quantized_recipe()
    assert gemm_out_width("scaled_mm", t.fprop_x, t.fprop_w, 200) == 208
    n = load_preset("nvfp4", **ALL_QUANTIZED).quantized_recipe()
    assert gemm_out_width("scaled_mm", n.fprop_x, n.fprop_w, 200) == 200


@pytest.mark.parametrize("shape", [(2, 68, 256), (136, 256), (256,)])
def test_strided_output_is_a_view_of_the_padded_buffer_with_the_same_values(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).bfloat16()
    grad = torch.randn(*shape[:-1], 200, generator=torch.Generator().manual_seed(4)).bfloat16()
    outs = {}
    for strided in (False, True):
        layer = _ragged_layer(strided)
        xx = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(xx)
        y.backward(grad)
        outs[strided] = (y, xx.grad, layer.weight.grad)
    y_strided, y_contiguous = outs[True][0], outs[False][0]
    assert y_contiguous.is_contiguous()
    assert y_strided.shape == y_contiguous.shape and y_strided.stride()[-2:] == (256, 1)[-y_strided.ndim :]
    assert not y_strided.is_contiguous() or y_strided.ndim == 1
    assert all(torch.equal(a, b) for a, b in zip(outs[True], outs[False]))


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("backend", ["emulated", "scaled_mm"])
def test_fprop_op_fake_has_the_real_outputs_layout(strided, backend):
    """torch.compile plans the graph around Y from the fake (inductor asserts the real strides against it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = _ragged_layer(strided, backend)
    x = torch.randn(2, 68, 256).bfloat16().requires_grad_(True)
    args = (layer.layer_id, layer.recipe_key, backend, torch.bfloat16, True, True, strided, "")
    real = ops.quant_linear_fprop(x, layer.weight, *args)
    with FakeTensorMode() as mode:
        fake = ops.quant_linear_fprop(mode.from_tensor(x), mode.from_tensor(layer.weight), *args)
    assert [(tuple(t.shape), t.stride(), t.dtype) for t in real] == [
        (tuple(t.shape), t.stride(), t.dtype) for t in fake
    ]
    assert real[0].stride()[1] == (256 if strided and backend == "scaled_mm" else 200)


def _mamba_model(strided: bool, seed=0):
    """One quantized Mamba block (d_model 64: in_proj 64 -> 388, padded to 512 by the 128x128 tiles) and an MLP,
    every linear on scaled_mm's operands."""
    from nvfp4train.model import build_model

    policy = load_preset("fp8_blockwise", **ALL_QUANTIZED)

    class ScaledMMLayers:  # the layer factory, on scaled_mm whatever the machine (the policy's auto might not say)
        def linear(self, in_features, out_features, *, block_index, name, strided_output=False):
            return QuantLinear(
                in_features, out_features, policy=policy, block_index=block_index, n_blocks=2, name=name,
                backend="scaled_mm", strided_output=strided_output,
            )  # fmt: skip

        def mlp(self, in_features, hidden_features, *, block_index):
            return None

    torch.manual_seed(seed)
    model = build_model({"pattern": "M-", "d_model": 64, "ssd_backend": "torch"}, layer_factory=ScaledMMLayers())
    assert model.blocks[0].mixer.in_proj.strided_output
    model.blocks[0].mixer.in_proj.strided_output = strided
    return model, PrecisionController(policy, model)


def test_mamba_block_reads_the_uncropped_in_proj_output_with_the_same_bits():
    tokens = torch.randint(0, 100, (2, 64), generator=torch.Generator().manual_seed(0))
    results = []
    for strided, compiled in ((False, False), (True, False), (True, True)):
        model, ctl = _mamba_model(strided)
        captured = []
        model.blocks[0].mixer.in_proj.register_forward_hook(lambda m, i, out: captured.append(out.stride()))
        torch._dynamo.reset()
        forward = torch.compile(model, backend="aot_eager") if compiled else model
        ctl.on_step(0.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(tokens).float().square().mean()
        loss.backward()
        if not compiled:
            assert captured[0][-2] == (512 if strided else 388)
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_c, grads_c), (loss_s, grads_s), (loss_compiled, _) = results
    assert torch.equal(loss_c, loss_s) and all(torch.equal(a, b) for a, b in zip(grads_c, grads_s))
    assert torch.equal(loss_compiled, loss_s)
