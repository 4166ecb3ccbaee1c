"""QuantLinear numerics: BF16 parity, weight consistency, per-operand toggles, SR placement,
determinism, emulation exactness and error against FP64, padding, dtypes, saved bytes."""

import pytest
import torch
from torch import nn

from nvfp4train.formats import hadamard, nvfp4
from nvfp4train.precision import ROLES, PrecisionPolicy, saved_activation_bytes, saved_bytes_report

from .helpers import ABLATION_CHANGES, GemmSpy, inputs, load_preset, make_layer, rel_err, run


@pytest.mark.parametrize("autocast, x_dtype", [(True, torch.float32), (True, torch.bfloat16), (False, torch.float32)])
def test_bf16_policy_reproduces_nn_linear_bitwise(autocast, x_dtype):
    layer = make_layer(load_preset("bf16"))
    ref = nn.Linear(64, 48, bias=False)
    ref.weight.data.copy_(layer.weight.data)
    x, grad = inputs(dtype=x_dtype)
    y, dx, dw = run(layer, x, grad, autocast)
    y_ref, dx_ref, dw_ref = run(ref, x, grad, autocast)
    assert y.dtype == y_ref.dtype and dx.dtype == dx_ref.dtype and dw.dtype == torch.float32
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape", [(512, 256), (4, 128, 256)])
def test_bf16_layer_weight_gradient_leaves_the_gemm_in_fp32_on_cuda(x_shape):
    """On CUDA a BF16 layer is F.linear's forward and input gradient, bit for bit; its weight gradient is the
    Wgrad GEMM's FP32 result (torch.mm with out_dtype), which F.linear would round to BF16: within half a BF16
    step of nn.Linear's, and closer to the FP64 product."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    layer = make_layer(load_preset("bf16"), in_f=256, out_f=384).cuda()
    ref = nn.Linear(256, 384, bias=False).cuda()
    ref.weight.data.copy_(layer.weight.data)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*x_shape, generator=g).cuda()
    grad = torch.randn(*x_shape[:-1], 384, generator=g).cuda().bfloat16()
    outs = []
    for module in (layer, ref):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = module(xi)
        y.backward(grad)
        outs.append((y, xi.grad, module.weight.grad))
    (y, dx, dw), (y_ref, dx_ref, dw_ref) = outs
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    assert dw.dtype == torch.float32 and not torch.equal(dw, dw_ref)
    exact = grad.double().flatten(0, -2).t() @ x.bfloat16().double().flatten(0, -2)
    assert (dw - dw_ref).abs().le(dw_ref.abs() * 2**-8).all()
    assert (dw.double() - exact).abs().mean() < (dw_ref.double() - exact).abs().mean()


@pytest.mark.parametrize("preset", ["nvfp4", "mxfp4", "fp8_blockwise", "fp8_tensorwise"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_output_in_autocast_dtype_and_fp32_weight_grads(preset, x_dtype):
    layer = make_layer(load_preset(preset))
    x, grad = inputs(dtype=x_dtype)
    y, dx, dw = run(layer, x, grad)
    assert y.dtype == torch.bfloat16 and dx.dtype == x_dtype and dw.dtype == torch.float32
    assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all()
    # Without autocast the output follows the input dtype, like nn.Linear.
    y32, _, _ = run(layer, x.float(), grad, autocast=False)
    assert y32.dtype == torch.float32


@pytest.mark.parametrize("preset", ["nvfp4", "mxfp4", "fp8_blockwise", "fp8_tensorwise"])
def test_autocast_quantizes_x_in_the_autocast_dtype(preset):
    """Under autocast an FP32 X is cast to BF16 before it is quantized, as F.linear and TE's linear do:
    the same Y, dW and (widened) dX as a BF16 X, and not what quantizing the FP32 X gives."""
    x, grad = inputs(dtype=torch.float32)
    x = x + 2.0**-12 * torch.sign(x)  # FP32 values off the BF16 grid, so the cast matters
    y, dx, dw = run(make_layer(load_preset(preset)), x, grad)
    y16, dx16, dw16 = run(make_layer(load_preset(preset)), x.bfloat16(), grad)
    assert dx.dtype == torch.float32 and dx16.dtype == torch.bfloat16
    assert torch.equal(y, y16) and torch.equal(dx, dx16.float()) and torch.equal(dw, dw16)
    y_fp32, _, _ = run(make_layer(load_preset(preset)), x, grad, autocast=False)
    assert not torch.equal(y_fp32.bfloat16(), y)


def test_dgrad_uses_the_fprop_weight_bit_for_bit(monkeypatch):
    spy = GemmSpy()
    layer = make_layer(load_preset("nvfp4"), in_f=64, out_f=40)  # out 40: the 16x16 tiles pad rows
    with spy.patch(monkeypatch):
        run(layer, *inputs(out_f=40))
    ops = spy.operands()
    assert torch.equal(ops["dgrad_w"][:, :40], ops["fprop_w"].t())
    # ... and that is the 16x16-tile quantization of W (formats' own packed path), not a re-quantization.
    w16 = nvfp4.quantize(torch.nn.functional.pad(layer.weight.detach(), (0, 0, 0, 8)), (16, 16))
    expect = w16.dequantize(torch.float64, apply_global_scale=False) * w16.global_decode_scale.double()
    assert torch.equal(ops["fprop_w"], expect[:40])


def test_1x16_weights_make_fprop_and_dgrad_see_different_weights(monkeypatch):
    spy = GemmSpy()
    with spy.patch(monkeypatch):
        run(make_layer(load_preset("nvfp4_no_2d")), *inputs())
    ops = spy.operands()
    assert not torch.equal(ops["dgrad_w"], ops["fprop_w"].t())


def _operands(monkeypatch, policy, seed=0):
    spy = GemmSpy()
    with spy.patch(monkeypatch):
        run(make_layer(policy, seed=seed), *inputs())
    return spy.operands()


@pytest.mark.parametrize("ablation, changed", ABLATION_CHANGES)
def test_each_toggle_changes_exactly_the_operands_it_names(monkeypatch, ablation, changed):
    base = _operands(monkeypatch, load_preset("nvfp4_all_layers"))
    other = _operands(monkeypatch, load_preset(ablation, bf16_first=0, bf16_last=0))
    assert {role for role in ROLES if not torch.equal(base[role], other[role])} == changed


@pytest.mark.parametrize(
    "preset, stochastic",
    [
        ("nvfp4_all_layers", {"dgrad_dy", "wgrad_dy"}),
        ("nvfp4_no_sr", set()),
        ("nvfp4_sr_everywhere", set(ROLES)),
        ("mxfp4", {"dgrad_dy", "wgrad_dy"}),
    ],
)
def test_stochastic_rounding_only_where_configured(monkeypatch, preset, stochastic):
    policy = load_preset(preset, bf16_first=0, bf16_last=0)
    a = _operands(monkeypatch, policy, seed=0)
    b = _operands(monkeypatch, policy, seed=1)
    again = _operands(monkeypatch, policy, seed=0)
    assert {role for role in ROLES if not torch.equal(a[role], b[role])} == stochastic
    assert all(torch.equal(a[role], again[role]) for role in ROLES)  # same seed, same bits


def test_determinism_with_a_seed():
    policy = load_preset("nvfp4_all_layers")
    first = run(make_layer(policy, seed=7), *inputs())
    second = run(make_layer(policy, seed=7), *inputs())
    other = run(make_layer(policy, seed=8), *inputs())
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert torch.equal(first[0], other[0])  # forward is RNE: seed-independent
    assert not torch.equal(first[2], other[2])  # Wgrad uses SR gradients


def test_wgrad_operands_are_rht_transformed_along_tokens(monkeypatch):
    """The Wgrad operands are RHT16(dYᵀ) and RHT16(Xᵀ) quantized; their product is still ≈ dYᵀX."""
    ops = _operands(monkeypatch, load_preset("nvfp4_all_layers", sr="none"))
    x, grad = inputs()
    xt_rht = hadamard.rht(x.t().contiguous(), d=16)
    q = nvfp4.quantize(xt_rht, (1, 16))
    expect = q.dequantize(torch.float64, apply_global_scale=False) * q.global_decode_scale.double()
    assert torch.equal(ops["wgrad_x"], expect)


@pytest.mark.parametrize("preset", ["nvfp4", "nvfp4_rht_everywhere", "mxfp4", "fp8_blockwise", "fp8_tensorwise"])
def test_emulated_gemms_equal_fp64_products_of_the_quantized_operands(monkeypatch, preset):
    """BF16 operands + FP32 accumulation + epilogue scales == the exact product of the dequantized
    operands, up to FP32 summation and the final rounding (BF16 for Y and dX, FP32 for dW)."""
    spy = GemmSpy()
    layer = make_layer(load_preset(preset, bf16_first=0, bf16_last=0))
    x, grad = inputs()
    with spy.patch(monkeypatch):
        y, dx, dw = run(layer, x, grad)
    ops = spy.operands()
    y_exact = ops["fprop_x"] @ ops["fprop_w"].t()
    dx_exact = (ops["dgrad_dy"] @ ops["dgrad_w"].t())[:, :64]
    dw_exact = ops["wgrad_dy"] @ ops["wgrad_x"].t()
    assert (y.double() - y_exact).abs().max() <= 2**-8 * y_exact.abs().max()
    assert (dx.double() - dx_exact).abs().max() <= 2**-8 * dx_exact.abs().max()
    assert rel_err(dw, dw_exact) < 1e-6


# Relative Frobenius error of Y, dX, dW against FP64 with unquantized operands, for Gaussian data.
# Each quantized operand carries the format's relative error (NVFP4 RNE ≈ 0.09, SR ≈ 0.13, MXFP4
# ≈ 0.12-0.17, FP8 E4M3 ≈ 0.025, E5M2 ≈ 0.05); a GEMM of two such operands has about the
# root-sum-square of the two; the bounds leave ~1.5x headroom.
ERROR_BOUNDS = {"nvfp4": 0.25, "mxfp4": 0.35, "fp8_blockwise": 0.06, "fp8_tensorwise": 0.1, "bf16": 0.01}


@pytest.mark.parametrize("preset", list(ERROR_BOUNDS))
def test_gradients_against_fp64_within_the_formats_error(preset):
    policy = load_preset(preset)
    layer = make_layer(policy, in_f=128, out_f=96, block_index=0, n_blocks=1)
    layer.set_switched(False)
    if preset != "bf16":  # n_blocks=1 with fractions: make sure the single block is quantized
        layer.recipe = policy.quantized_recipe()
    x, grad = inputs(tokens=128, in_f=128, out_f=96)
    y, dx, dw = run(layer, x, grad)
    w = layer.weight.detach().double()
    xd, gd = x.double(), grad.double()
    errs = [rel_err(y, xd @ w.t()), rel_err(dx, gd @ w), rel_err(dw, gd.t() @ xd)]
    assert max(errs) < ERROR_BOUNDS[preset], errs
    if preset != "bf16":
        assert min(errs) > 1e-3, "quantization should leave a visible error"


def test_sr_gradients_are_unbiased_on_average():
    """Averaging Wgrad over SR draws of dY converges to the GEMM with the (deterministic, RNE) quantized
    X operand: the SR part of the error shrinks like 1/sqrt(draws), which a biased rounding would not do."""
    policy = load_preset("nvfp4_all_layers", rht="none")
    x, grad = inputs(tokens=64)
    layer = make_layer(policy)
    # the Wgrad X operand: X^T quantized 1x16 along tokens with RNE, exactly as the layer does it
    xq_t, s_x = nvfp4.fake_quantize(x.t().contiguous(), tile=(1, 16), rounding="rne")
    target = grad.double().t() @ (xq_t.double() * s_x.double()).t()
    draws = [run(layer, x, grad)[2].double() for _ in range(24)]
    single = rel_err(draws[0], target)
    mean = rel_err(torch.stack(draws).mean(0), target)
    assert mean < 0.35 * single  # 1/sqrt(24) = 0.20 for unbiased draws


@pytest.mark.parametrize("preset", ["nvfp4", "mxfp4", "fp8_blockwise", "nvfp4_rht_everywhere"])
def test_shapes_the_tiles_do_not_divide_are_padded(monkeypatch, preset):
    policy = load_preset(preset)
    layer = make_layer(policy, in_f=40, out_f=24)
    layer.recipe = policy.quantized_recipe()
    x, grad = inputs(tokens=37, in_f=40, out_f=24)
    y, dx, dw = run(layer, x.reshape(37, 40), grad)
    assert y.shape == (37, 24) and dx.shape == (37, 40) and dw.shape == (24, 40)
    w = layer.weight.detach().double()
    assert rel_err(y, x.double() @ w.t()) < 0.35
    assert rel_err(dw, grad.double().t() @ x.double()) < 0.35


def test_leading_dims_are_flattened_into_tokens():
    layer = make_layer(load_preset("nvfp4_all_layers"))
    x, grad = inputs(tokens=64)
    y2, dx2, dw2 = run(layer, x, grad)
    y3, dx3, dw3 = run(make_layer(load_preset("nvfp4_all_layers")), x.reshape(4, 16, 64), grad.reshape(4, 16, 48))
    assert torch.equal(y3.reshape(64, 48), y2) and torch.equal(dx3.reshape(64, 64), dx2) and torch.equal(dw3, dw2)


def test_saved_activations_are_packed_not_bf16():
    """Between forward and backward an NVFP4 layer keeps the packed Wgrad copy of X (4-bit codes +
    E4M3 scale per 16 = 0.5625 B/element) where nn.Linear keeps BF16 X (2 B/element)."""
    tokens, in_f, out_f = 1024, 64, 64
    x = torch.randn(tokens, in_f).to(torch.bfloat16)
    ref = saved_activation_bytes(nn.Linear(in_f, out_f, bias=False), x)
    assert ref == tokens * in_f * 2 + in_f * out_f * 2  # bf16 X + bf16 cast of W
    nv = saved_activation_bytes(make_layer(load_preset("nvfp4_all_layers"), in_f, out_f), x)
    packed_x, packed_w = tokens * in_f * 9 // 16, in_f * out_f * 9 // 16
    assert nv == packed_x + packed_w + 4 * 4  # + amax and decode scale of each
    assert nv / ref < 0.3
    bf = saved_activation_bytes(make_layer(load_preset("bf16"), in_f, out_f), x)
    assert bf == ref
    fp8 = saved_activation_bytes(make_layer(load_preset("fp8_tensorwise", bf16_first=0, bf16_last=0), in_f, out_f), x)
    assert fp8 == tokens * in_f + 4  # FP8 X + its scale; W is re-quantized from the parameter
    # A backward switched to BF16 must keep the BF16 copy again.
    switched = make_layer(
        load_preset("nvfp4_all_layers", switch={"at_fraction": 0.5, "mode": "backward_only"}), in_f, out_f
    )
    switched.set_switched(True)
    assert saved_activation_bytes(switched, x) == tokens * in_f * 2


def test_scaled_mm_and_te_refuse_clearly_without_hardware():
    from nvfp4train.precision import build_linear_factory

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    with pytest.raises(ValueError, match="scaled_mm.*CUDA"):
        build_linear_factory(PrecisionPolicy.from_dict({"format": "fp8_tensorwise", "backend": "scaled_mm"}), 4, 0)
    with pytest.raises(ValueError, match="scaled_mm runs the FP8 policies only"):
        build_linear_factory(PrecisionPolicy.from_dict({"format": "nvfp4", "backend": "scaled_mm"}), 4, 0)
    with pytest.raises(ValueError, match="backend='te' cannot run here"):
        build_linear_factory(PrecisionPolicy.from_dict({"format": "fp8_blockwise", "backend": "te"}), 4, 0)
    factory = build_linear_factory(load_preset("fp8_tensorwise"), 4, 0)
    assert factory.backend_name == "emulated" and "not scaled_mm" in factory.backend_reason


@pytest.mark.parametrize("k", [128, 384, 512, 640])
def test_blockwise_k_padding_for_scaled_mm_keeps_the_product(k):
    """scaled_mm's 1x128 x 128x128 GEMM gets K zero-padded to a multiple of 4 blocks (cuBLASLt reads
    the tile scales in groups of 4; on torch 2.11 other K gave wrong products): padded codes are 0,
    padded scales 1, so both operands dequantize to themselves followed by zero columns."""
    from nvfp4train.precision.backends.scaled_mm import TILE_K_MULTIPLE, _dequantized, _probe_operand, pad_fp8_k
    from nvfp4train.precision.operands import Quantized

    gen = torch.Generator().manual_seed(0)
    x = _probe_operand(256, k, (1, 128), "cpu", gen)
    w = _probe_operand(256, k, (128, 128), "cpu", gen)
    k_pad = -(-k // TILE_K_MULTIPLE) * TILE_K_MULTIPLE
    padded = [Quantized(None, None, *pad_fp8_k(q.fp8_data, q.fp8_scales, k_pad), q.spec) for q in (x, w)]
    for q, p in zip((x, w), padded):
        assert p.fp8_data.shape == (256, k_pad) and p.fp8_scales.shape[1] == k_pad // 128
        dense = _dequantized(p)
        assert torch.equal(dense[:, :k], _dequantized(q)) and not dense[:, k:].any()
        assert (p.fp8_data is q.fp8_data) == (k == k_pad)
    # in float64: the product itself, not the BF16 rounding of a CPU GEMM whose blocking depends on K
    ref = _dequantized(x).double() @ _dequantized(w).double().t()
    out = _dequantized(padded[0]).double() @ _dequantized(padded[1]).double().t()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("in_f,out_f", [(256, 192), (640, 328)])
def test_scaled_mm_layer_makes_blockwise_operands_at_its_gemm_k(monkeypatch, in_f, out_f):
    """A 128x128-tiled blockwise layer on backend scaled_mm makes its Fprop and Dgrad operands at K a multiple
    of TILE_K_MULTIPLE (the kernels write the zero columns; nothing is padded per GEMM). On CPU its GEMMs run
    emulated, so against the emulated layer: the same operands followed by zero columns; Y, dX and dW within
    the rounding of a different summation order. Ragged out_f (328): the Dgrad dY pair comes from one padded read
    as well."""
    from nvfp4train.precision.backends import TILE_K_MULTIPLE

    policy = load_preset("fp8_blockwise", bf16_first=0, bf16_last=0)
    x, grad = inputs(tokens=256, in_f=in_f, out_f=out_f)
    ops, outs = {}, {}
    for backend in ("emulated", "scaled_mm"):
        spy = GemmSpy()
        with spy.patch(monkeypatch):
            outs[backend] = run(make_layer(policy, in_f, out_f, backend=backend), x, grad)
        ops[backend] = spy.operands()
    for role in ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w"):
        a, b = ops["scaled_mm"][role], ops["emulated"][role]
        assert a.shape[1] % TILE_K_MULTIPLE == 0, (role, a.shape)
        k = b.shape[1]
        assert a.shape[0] == b.shape[0] and torch.equal(a[:, :k], b) and not a[:, k:].any(), role
    for role in ("wgrad_dy", "wgrad_x"):
        assert torch.equal(ops["scaled_mm"][role], ops["emulated"][role]), role
    # the products over the longer K: the same sums, in the order the CPU GEMM's blocking for that K takes
    for got, want in zip(outs["scaled_mm"], outs["emulated"]):
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)


def test_no_grad_forward_saves_nothing_and_matches_the_training_forward():
    layer = make_layer(load_preset("nvfp4_all_layers"))
    x, grad = inputs()
    y_train = run(layer, x, grad)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y_eval = layer(x)
    assert torch.equal(y_eval, y_train)
    layer.weight.requires_grad_(False)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: pytest.fail("saved a tensor"), lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x)  # neither x nor the (frozen) weight needs a gradient


def test_only_what_backward_needs_is_saved():
    tokens, in_f, out_f = 256, 64, 64
    x = torch.randn(tokens, in_f).to(torch.bfloat16)
    layer = make_layer(load_preset("nvfp4_all_layers"), in_f, out_f)
    both = saved_activation_bytes(layer, x)
    layer.weight.requires_grad_(False)  # frozen W: no Wgrad, so no copy of X; Dgrad still needs W
    assert saved_activation_bytes(layer, x) == in_f * out_f * 9 // 16 + 8
    layer.weight.requires_grad_(True)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)  # x needs no gradient (a first layer): no Dgrad, so no packed W
    saved.pop(layer.weight.untyped_storage().data_ptr(), None)
    assert sum(saved.values()) == tokens * in_f * 9 // 16 + 8 == both - (in_f * out_f * 9 // 16 + 8)


def test_saved_bytes_report_against_nn_linear():
    report = saved_bytes_report(load_preset("nvfp4_all_layers"), 64, 64, tokens=2048)
    # X packed (0.5625 B) + packed W vs X in BF16 (2 B) + the BF16 cast of W.
    expect = (2048 * 64 * 9 / 16 + 64 * 64 * 9 / 16 + 16) / (2048 * 64 * 2 + 64 * 64 * 2)
    assert report["ratio"] == pytest.approx(expect)


def test_backward_state_goes_through_save_for_backward_only():
    """Saved-tensor hooks (activation offloading) see every tensor backward uses: the autograd
    node keeps no tensor (nor packed operand, nor the layer) beside them, and hooks that hand
    back copies give the same gradients."""
    x, grad = inputs()
    reference = run(make_layer(load_preset("nvfp4_all_layers")), x, grad)
    layer = make_layer(load_preset("nvfp4_all_layers"))  # the same SR streams from the start
    packed = []

    def offload(t):
        packed.append(t)
        return t.clone()

    xx = x.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(offload, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(xx)
    leftovers = {
        k: type(v).__name__
        for k, v in vars(y.grad_fn).items()
        if isinstance(v, (torch.Tensor, nn.Module)) or hasattr(v, "tensors")
    }
    assert not leftovers
    assert len(packed) == 1 + 4 + 4  # W, the packed Wgrad X (codes, scales, amax, s_dec), the packed 2-D W
    y.backward(grad.to(y.dtype))
    assert torch.equal(y.detach(), reference[0]) and torch.equal(xx.grad, reference[1])
    assert torch.equal(layer.weight.grad, reference[2])


@pytest.mark.parametrize(
    "preset, backend, peak",
    [
        ("nvfp4", "emulated", "bf16"),
        ("fp8_tensorwise", "emulated", "bf16"),
        ("bf16", "emulated", "bf16"),
        ("fp8_tensorwise", "scaled_mm", "fp8"),
        ("fp8_blockwise", "te", "fp8"),
        ("nvfp4", "te", "fp4"),
        ("mxfp4", "te", "fp4"),
        ("bf16", "te", "bf16"),
    ],
)
def test_gemm_peak_kind_names_the_peak_the_backend_runs_at(preset, backend, peak):
    from nvfp4train.precision import gemm_peak_kind

    policy = load_preset(preset)
    assert gemm_peak_kind(policy, backend) == peak
    assert gemm_peak_kind(policy.to_dict(), backend) == peak  # a config mapping works too


@pytest.mark.parametrize("tokens", [64, 50])  # 50: no tile divides the tokens
def test_tensorwise_wgrad_x_is_fprops_codes_transposed_bit_for_bit(monkeypatch, tokens):
    """fp8_tensorwise saves Xᵀ as Fprop's FP8 codes transposed, and Wgrad's dYᵀ is Dgrad's, each pair from
    one cast (fp8.quantize_tensorwise_rowcol; no second quantization of a transposed BF16 copy): the saved
    tensors, Y, dX and dW are those of quantizing Xᵀ and dYᵀ themselves, NaN included."""
    from nvfp4train.precision import pairs

    policy = load_preset("fp8_tensorwise", bf16_first=0, bf16_last=0)
    x, grad = inputs(tokens=tokens)
    x_nan = x.clone()
    x_nan[3, 7] = float("nan")
    for xx in (x, x * 1e-3, x_nan):
        saved = {}
        used, used_dy = [], []
        real, real_dy = pairs.fprop_and_wgrad_x, pairs.dgrad_and_wgrad_dy
        for route in ("one cast", "quantized again"):
            if route == "one cast":  # the routes must really be taken
                monkeypatch.setattr(pairs, "fprop_and_wgrad_x", lambda *a: used.append(real(*a)) or used[-1])
                monkeypatch.setattr(pairs, "dgrad_and_wgrad_dy", lambda *a: used_dy.append(real_dy(*a)) or used_dy[-1])
            else:
                monkeypatch.setattr(pairs, "fprop_and_wgrad_x", lambda *args: None)
                monkeypatch.setattr(pairs, "dgrad_and_wgrad_dy", lambda *args: None)
            captured = []

            def keep(t):
                captured.append(t.detach().clone())
                return t

            with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
                results = run(make_layer(policy), xx, grad)
            saved[route] = (captured, results)
            monkeypatch.undo()
        assert len(used) == len(used_dy) == 1 and used[0] is not None and used_dy[0] is not None
        (got, got_results), (want, want_results) = saved["one cast"], saved["quantized again"]
        assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in want]
        for a, b in zip(got + list(got_results), want + list(want_results)):
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
            assert torch.equal(a.view(bits), b.view(bits))
