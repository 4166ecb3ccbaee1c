"""FP8 E4M3/E5M2: per-tensor current scaling and DeepSeek-style blockwise scaling."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nvfp4train.formats import fp8

from .strategies import tensors

# Half a mantissa step relative (RNE), and half the smallest subnormal, per format.
REL_HALF_ULP = {torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3}
HALF_MIN_SUBNORMAL = {torch.float8_e4m3fn: 2.0**-10, torch.float8_e5m2: 2.0**-17}
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def test_saturating_cast_saturates_and_keeps_nan():
    x = torch.tensor([1e6, -1e6, 470.0, float("nan")])
    e4m3 = fp8.saturating_cast(x, torch.float8_e4m3fn).to(torch.float32)
    assert e4m3[:3].tolist() == [448.0, -448.0, 448.0] and torch.isnan(e4m3[3])
    e5m2 = fp8.saturating_cast(torch.tensor([1e6, 61440.0]), torch.float8_e5m2).to(torch.float32)
    assert e5m2.tolist() == [57344.0, 57344.0]  # a plain cast gives inf for both


def check_error(x, dequantized, decode, dtype):
    """Every element within half an FP8 step of x, in the units of its decode scale."""
    x64 = x.to(torch.float64)
    bound = torch.maximum(REL_HALF_ULP[dtype] * x64.abs(), HALF_MIN_SUBNORMAL[dtype] * decode.double())
    assert bool(((x64 - dequantized.double()).abs() <= bound * (1 + 1e-6)).all())


@settings(max_examples=30, deadline=None)
@given(x=tensors(col_multiple=128), dtype=st.sampled_from(FP8), pow2=st.booleans())
def test_tensorwise_maps_amax_to_fp8_max_and_rounds_to_nearest(x, dtype, pow2):
    data, decode = fp8.quantize_tensorwise(x, dtype, pow2_scales=pow2)
    assert data.dtype == dtype and data.shape == x.shape and decode.shape == ()
    amax = x.to(torch.float32).abs().max()
    top = data.to(torch.float32).abs().max()
    if pow2:
        assert torch.frexp(decode).mantissa == 0.5  # a power of two
        assert top <= fp8.fp8_max(dtype) and amax <= fp8.fp8_max(dtype) * decode  # never clips
    else:
        assert top == fp8.fp8_max(dtype)
    check_error(x, data.to(torch.float32) * decode, decode, dtype)
    values, dec = fp8.fake_quantize_tensorwise(x, dtype, pow2_scales=pow2)
    assert values.dtype == x.dtype and torch.equal(values.float(), data.float()) and dec == decode


@settings(max_examples=15, deadline=None)
@given(
    x=tensors(row_multiple=128, col_multiple=128),
    dtype=st.sampled_from(FP8),
    pow2=st.booleans(),
    block=st.sampled_from([(1, 128), (128, 128)]),
)
def test_blockwise_scales_each_block_by_its_own_amax(x, dtype, pow2, block):
    data, scales = fp8.quantize_blockwise(x, block, dtype, pow2_scales=pow2)
    rows, cols = x.shape
    assert scales.shape == (rows // block[0], cols // 128) and scales.dtype == torch.float32
    blocks = x.to(torch.float32).reshape(rows // block[0], block[0], cols // 128, 128)
    amax = blocks.abs().amax(dim=(1, 3))
    top = data.to(torch.float32).reshape_as(blocks).abs().amax(dim=(1, 3))
    live = amax > 0
    if pow2:
        assert bool((torch.frexp(scales).mantissa == 0.5).all())
        assert bool((amax <= fp8.fp8_max(dtype) * scales).all())
    else:
        assert bool((top[live] == fp8.fp8_max(dtype)).all())
    assert bool((scales[~live] == 1.0).all())
    dequantized = fp8.dequantize_blockwise(data, scales, block)
    decode = scales.repeat_interleave(block[0], 0).repeat_interleave(128, 1)
    check_error(x, dequantized, decode, dtype)
    values, one = fp8.fake_quantize_blockwise(x, block, dtype, pow2_scales=pow2)
    assert one == 1.0 and torch.equal(values, dequantized)
    if pow2:  # fp8 x 2^k is exact in bf16
        values_bf16, _ = fp8.fake_quantize_blockwise(x, block, dtype, pow2_scales=True, out_dtype=torch.bfloat16)
        assert torch.equal(values_bf16.to(torch.float32), values)


def test_128x128_weight_and_its_transpose_quantize_identically():
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(0))
    data, scales = fp8.quantize_blockwise(w, (128, 128))
    data_t, scales_t = fp8.quantize_blockwise(w.t(), (128, 128))
    assert torch.equal(data.view(torch.uint8).t(), data_t.view(torch.uint8)) and torch.equal(scales.t(), scales_t)


def test_non_finite_input_gives_nan_scales():
    x = torch.randn(256, 256)
    x[3, 200] = float("inf")
    _, decode = fp8.quantize_tensorwise(x)
    assert torch.isnan(decode)
    data, scales = fp8.quantize_blockwise(x, (1, 128))
    assert torch.isnan(scales[3, 1]) and torch.isfinite(scales[[0, 1, 2, 4], :]).all() and torch.isfinite(scales[3, 0])
    assert torch.isnan(fp8.dequantize_blockwise(data, scales)[3, 128:]).all()
    x[3, 200] = float("nan")
    data, decode = fp8.quantize_tensorwise(x, pow2_scales=True)
    assert torch.isnan(decode)


def test_zeros_quantize_to_zero_with_unit_scale():
    data, decode = fp8.quantize_tensorwise(torch.zeros(4, 128))
    assert decode == 1.0 and not data.float().any()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: fp8.quantize_tensorwise(torch.randn(4, 4), torch.int8), ValueError, "dtype"),
        (lambda: fp8.quantize_blockwise(torch.randn(128, 100)), ValueError, "must divide"),
        (lambda: fp8.quantize_blockwise(torch.randn(64, 128), (128, 128)), ValueError, "must divide"),
        (lambda: fp8.quantize_blockwise(torch.randn(128, 128), (32, 32)), ValueError, "block"),
        (lambda: fp8.quantize_tensorwise(torch.randn(4, 4).double()), TypeError, "dtype"),
    ],
)
def test_bad_input_raises_one_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_blockwise_scale_of_a_tiny_block_is_the_input_dtypes_max_as_te():
    """A block amax below fp8_max / FLT_MAX (~1.3e-36) overflows fp8_max / amax in FP32. TE's
    blockwise kernels then use the input dtype's max as the encode scale (bf16: 3.39e38), not
    FLT_MAX; per tensor (Float8CurrentScaling) it stays FLT_MAX. Power-of-two scales agree (2^127)."""
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(0))
    x[0, :128] *= 1e-37  # block (0, 0): amax ~3e-37
    x = x.to(torch.bfloat16)
    bf16_max, flt_max = torch.finfo(torch.bfloat16).max, torch.finfo(torch.float32).max
    data, scales = fp8.quantize_blockwise(x, (1, 128))
    tiny = x[0, :128].float()
    assert scales[0, 0] == torch.reciprocal(torch.tensor(bf16_max))
    assert torch.equal(
        data[0, :128].view(torch.uint8), fp8.saturating_cast(tiny * bf16_max, torch.float8_e4m3fn).view(torch.uint8)
    )
    # The decode scale (what dequantizes the block) is not 1/FLT_MAX; the other blocks are as before.
    assert scales[0, 0] != torch.reciprocal(torch.tensor(flt_max))
    ref_data, ref_scales = fp8.quantize_blockwise(x[:, 128:], (1, 128))
    assert torch.equal(scales[:, 1:], ref_scales) and torch.equal(
        data[:, 128:].view(torch.uint8), ref_data.view(torch.uint8)
    )
    # FP32 input: its own max is FLT_MAX. Power-of-two scales: 2^127 either way.
    assert fp8.quantize_blockwise(x.float(), (1, 128))[1][0, 0] == torch.reciprocal(torch.tensor(flt_max))
    assert fp8.quantize_blockwise(x, (1, 128), pow2_scales=True)[1][0, 0] == 2.0**-127
    # Per tensor: FLT_MAX for a bf16 tensor too.
    assert fp8.quantize_tensorwise(x[:1, :128])[1] == torch.reciprocal(torch.tensor(flt_max))
