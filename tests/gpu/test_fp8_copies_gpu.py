"""GPU checks of blockwise FP8 without per-step copies (marked gpu: skipped without CUDA).

    python -m pytest -q -m gpu tests/gpu/test_fp8_copies_gpu.py tests/formats/test_fp8_tiles.py

1. The Triton pass that writes a weight's 128x128 tiles and their transpose (`pairs.weight_and_transpose`)
   gives, at hybrid_1b's weight shapes and scaled_mm's K widths, the bits of the copying path (the 128x128
   quantizer, then Fprop's codes transposed and K-padded by torch).
2. A Mamba in_proj's output on scaled_mm (`strided_output`) is the GEMM's own N-padded buffer (no cropping
   copy), with the values and gradients of the contiguous output.
3. A small hybrid model on scaled_mm with that output: eager == eager with the contiguous output (loss and
   gradients bit for bit, in `train.deterministic` mode: mamba-ssm's SSD backward otherwise sums with atomics,
   so two eager backwards of one model differ in the last bits), and torch.compile (inductor, which asserts
   the custom op's output strides against its fake) runs it to the same loss.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic_mode needs it

from nvfp4train.precision import (
    PrecisionController,
    PrecisionPolicy,
    QuantLinear,
    build_linear_factory,
    operands,
    ops,
    pairs,
)
from nvfp4train.precision.backends import SCALED_MM
from nvfp4train.train.determinism import deterministic_mode

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def policy(**overrides) -> PrecisionPolicy:
    from nvfp4train.config import load_preset

    base = {**load_preset("precision", "fp8_blockwise"), "bf16_first": 0, "bf16_last": 0, "stats_every": 0}
    return PrecisionPolicy.from_dict({**base, **overrides})


def needs_scaled_mm(p: PrecisionPolicy) -> None:
    why = SCALED_MM.unsupported(p)
    if why:
        pytest.skip(why)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = torch.uint8 if a.element_size() == 1 else torch.int32
    return torch.equal(a.view(bits), b.view(bits))


# hybrid_1b's quantized weights [out, in]: in_proj (10,304 outputs: 80.5 tiles), out_proj, qkv, out, fc1, fc2;
# and a small ragged one
WEIGHTS = [(10304, 2048), (2048, 4096), (3072, 2048), (2048, 2048), (8192, 2048), (2048, 8192), (200, 300)]


@pytest.mark.parametrize("out_f, in_f", WEIGHTS)
def test_weight_and_transpose_on_cuda_are_the_copying_paths_bits(out_f, in_f):
    recipe = policy().quantized_recipe()
    spec = recipe.fprop_w
    k_f, k_d = ops._fprop_k(in_f, recipe, "scaled_mm"), ops._dgrad_k(out_f, recipe, "scaled_mm")
    gen = torch.Generator(device="cuda").manual_seed(out_f + in_f)
    w = torch.randn(out_f, in_f, device="cuda", generator=gen) * 0.02
    w[:128, :256] *= 1e-4
    packed = operands.pack(w, spec, k_f)
    copied = ops._transposed_weight(packed.dequantize(), in_f, k_d)
    one_pass, transposed = pairs.weight_and_transpose(w, spec, k_f, k_d)
    assert all(same_bits(a, b) for a, b in zip(one_pass.tensors, packed.tensors))
    assert same_bits(transposed.fp8_data, copied.fp8_data) and same_bits(transposed.fp8_scales, copied.fp8_scales)
    assert transposed.rows == copied.rows == in_f


def ragged_layer(p, strided: bool, in_f=256, out_f=200):
    layer = QuantLinear(in_f, out_f, policy=p, block_index=0, n_blocks=1, name="in_proj", backend="scaled_mm")
    layer = layer.cuda()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        layer.weight.copy_((torch.randn(out_f, in_f, generator=gen) * 0.05).cuda())
    layer.strided_output = strided
    return layer


def test_strided_in_proj_output_is_the_gemms_own_buffer_with_the_same_values():
    p = policy()
    needs_scaled_mm(p)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 256, generator=gen).bfloat16().cuda()  # 200 tokens: the GEMM pads M to 208
    grad = torch.randn(200, 200, generator=gen).bfloat16().cuda()
    outs = {}
    for strided in (False, True):
        layer = ragged_layer(p, strided)
        xx = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(xx)
        y.backward(grad)
        outs[strided] = (y.detach(), xx.grad, layer.weight.grad)
        if strided:  # W's 128-row tiles pad N to 256, cuBLASLt M to 208: the cuBLAS output itself, uncopied
            assert y.stride() == (256, 1) and y.untyped_storage().nbytes() == 208 * 256 * 2
        else:
            assert y.is_contiguous()
    assert all(torch.equal(a, b) for a, b in zip(outs[True], outs[False]))


def test_hybrid_with_the_strided_in_proj_output_eager_and_compiled():
    from nvfp4train.model import build_model

    p = policy(backend="scaled_mm")
    needs_scaled_mm(p)
    tokens = torch.randint(0, 1000, (2, 256), generator=torch.Generator().manual_seed(0)).cuda()
    results = []
    for strided, compiled in ((False, False), (True, False), (True, True)):
        torch.manual_seed(0)
        model = build_model({"pattern": "M-", "d_model": 256}, layer_factory=build_linear_factory(p, 2, seed=1))
        in_proj = model.blocks[0].mixer.in_proj
        in_proj.strided_output = strided
        model = model.cuda()
        ctl = PrecisionController(p, model)
        strides = []
        if not compiled:
            in_proj.register_forward_hook(lambda m, i, out: strides.append(out.stride()))
        torch._dynamo.reset()
        forward = torch.compile(model) if compiled else model
        ctl.on_step(0.0)
        with deterministic_mode(True), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(tokens).float().square().mean()
            loss.backward()
        if not compiled:  # in_proj 256 -> 1,168 (z and x 2 x 512, B and C 2 x 64, 16 heads): 10 tiles of 128
            assert strides[0][-2] == (1280 if strided else 1168)
        results.append((loss.detach(), [p_.grad.clone() for p_ in model.parameters()]))
    (loss_c, grads_c), (loss_s, grads_s), (loss_compiled, grads_compiled) = results
    assert torch.equal(loss_c, loss_s) and all(torch.equal(a, b) for a, b in zip(grads_c, grads_s))
    assert torch.allclose(loss_compiled, loss_s, rtol=1e-3)
    assert all(g.isfinite().all() for g in grads_compiled)
