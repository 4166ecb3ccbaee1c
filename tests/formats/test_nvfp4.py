"""NVFP4 behaviour beyond the golden vectors: properties over shapes, dtypes and magnitudes,
edge cases (zeros, sign of zero, clipping, scale underflow, non-finite input) and errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nvfp4train.formats import e2m1, nvfp4, sr_generator

from .strategies import E2M1_GRID, E4M3_TABLE, nearest_even, tensors

FLT_MAX = torch.finfo(torch.float32).max
TILES = [(1, 16), (16, 16)]


def block_amax(x: torch.Tensor, tile) -> torch.Tensor:
    """[rows, cols/16] amax per scale block, 16x16 tiles repeated on their rows (test-side)."""
    rows, cols = x.shape
    a = x.to(torch.float64).abs()
    if tile == (1, 16):
        return a.reshape(rows, cols // 16, 16).amax(-1)
    t = a.reshape(rows // 16, 16, cols // 16, 16).amax(dim=(1, 3))
    return t.repeat_interleave(16, dim=0)


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so comparisons see -0.0 vs +0.0 (and NaN payloads)."""
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


@settings(max_examples=60, deadline=None)
@given(x=tensors(), tile=st.sampled_from(TILES))
def test_rne_scales_and_elements_are_nearest(x, tile):
    q = nvfp4.quantize(x, tile=tile)
    rows, cols = x.shape
    assert q.codes.shape == (rows, cols // 2) and q.codes.dtype == torch.uint8
    assert q.scales.shape == (rows, cols // 16) and q.scales.dtype == torch.float8_e4m3fn
    amax = x.to(torch.float32).abs().max()
    assert q.amax.shape == () and q.amax == amax

    # Global scales: one FP32 division, as TE.
    s_enc = torch.tensor(2688.0) / amax if amax > 0 else torch.tensor(1.0)
    assert q.global_decode_scale == torch.reciprocal(s_enc)

    # Block scale: the E4M3 value nearest (ties to even) to amax_b * (s_enc * fp32(1/6)), saturated at 448.
    multiplier = s_enc * torch.reciprocal(torch.tensor(6.0))
    target = (block_amax(x, tile).to(torch.float32) * multiplier).clamp(max=448.0)
    want_scale_bits = nearest_even(E4M3_TABLE, target).reshape(rows, cols // 16)
    assert torch.equal(q.scales.view(torch.uint8).long(), want_scale_bits)

    # Elements: nearest E2M1 point (ties to even code) to clamp(x * enc_b, -6, 6), enc_b from the stored scale.
    enc_b = torch.clamp(torch.reciprocal(q.scales.to(torch.float32) * q.global_decode_scale), max=FLT_MAX)
    y = (x.to(torch.float32).reshape(rows, -1, 16) * enc_b.unsqueeze(-1)).clamp(-6, 6).reshape(rows, cols)
    codes = q.unpacked_codes()
    assert torch.equal((codes & 7).long().reshape(-1), nearest_even(E2M1_GRID, y.abs()))
    assert torch.equal(codes >> 3 == 1, y < 0)


@settings(max_examples=40, deadline=None)
@given(x=tensors(), tile=st.sampled_from(TILES), rounding=st.sampled_from(["rne", "sr"]), seed=st.integers(0, 1000))
def test_fake_quantize_equals_packed_path_bit_for_bit(x, tile, rounding, seed):
    q = nvfp4.quantize(x, tile=tile, rounding=rounding, generator=sr_generator(seed))
    values, s_dec = nvfp4.fake_quantize(
        x, tile=tile, rounding=rounding, generator=sr_generator(seed), out_dtype=torch.float32
    )
    assert torch.equal(as_bits(values), as_bits(q.dequantize(torch.float32, apply_global_scale=False)))
    assert torch.equal(s_dec, q.global_decode_scale)
    # e2m1 * e4m3 is exact in bf16: casting loses nothing, and the bf16 output path agrees.
    values_bf16, _ = nvfp4.fake_quantize(
        x, tile=tile, rounding=rounding, generator=sr_generator(seed), out_dtype=torch.bfloat16
    )
    assert torch.equal(as_bits(values_bf16.to(torch.float32)), as_bits(values))
    assert torch.equal(as_bits(q.dequantize(torch.bfloat16, apply_global_scale=False)), as_bits(values_bf16))
    # Default out_dtype is x's dtype; the full dequantize applies s_dec in FP32.
    assert nvfp4.fake_quantize(x, tile=tile)[0].dtype == x.dtype
    assert torch.equal(q.dequantize(), values * s_dec)


@settings(max_examples=30, deadline=None)
@given(w=tensors(col_multiple=16))
def test_16x16_weight_and_its_transpose_quantize_identically(w):
    q, qt = nvfp4.quantize(w, tile=(16, 16)), nvfp4.quantize(w.t(), tile=(16, 16))
    assert torch.equal(q.unpacked_codes().t(), qt.unpacked_codes())
    rows, cols = w.shape
    tile_scales = q.scales.view(torch.uint8)[::16]  # one row per tile row
    assert torch.equal(q.scales.view(torch.uint8), tile_scales.repeat_interleave(16, dim=0))
    assert torch.equal(qt.scales.view(torch.uint8)[::16], tile_scales.t())
    assert torch.equal(q.dequantize().t(), qt.dequantize())
    # With 1x16 tiles the two copies differ in general (the reason for 2-D weight scaling).


@settings(max_examples=30, deadline=None)
@given(x=tensors(dtypes=(torch.float32,)), tile=st.sampled_from(TILES))
def test_dequantization_error_is_within_half_a_grid_step(x, tile):
    """|x - x_hat| <= half the local E2M1 spacing in the block's units, except where the value
    clipped at 6: only when the block's E4M3 scale rounded down, which costs at most 2^-4
    relative for a normal E4M3 scale (subnormal scales, in wide-range tensors, can clip more)."""
    q = nvfp4.quantize(x, tile=tile)
    x64, x_hat = x.to(torch.float64), q.dequantize().to(torch.float64)
    scales = q.scales.to(torch.float64).repeat_interleave(16, dim=-1)
    unit = scales * q.global_decode_scale.double()
    magnitude = e2m1.decode(q.unpacked_codes() & 7, torch.float64)
    half_step = torch.where(magnitude < 2, 0.25, torch.where(magnitude < 4, 0.5, 1.0)) * unit
    # Underflowed scales (unit == 0) dequantize to 0; their inputs are below amax * 2^-10 / 448.
    bound = torch.where(unit > 0, half_step, q.amax.double() * 2.0**-10 / 448)
    clipped = (magnitude == 6) & (x64.abs() > 6 * unit)
    overshoot = torch.where(clipped, x64.abs() - 6 * unit, 0.0)
    err = (x64 - x_hat).abs()
    assert bool((err <= bound * (1 + 1e-6) + overshoot).all()), float((err - bound - overshoot).max())
    normal_scale = scales >= 2.0**-6
    assert bool((overshoot[normal_scale] <= 6 * unit[normal_scale] * 2.0**-4 * (1 + 1e-6)).all())


def test_n_dimensional_input_keeps_leading_dims():
    x = torch.randn(2, 8, 64)
    q = nvfp4.quantize(x)
    assert q.codes.shape == (2, 8, 32) and q.scales.shape == (2, 8, 4) and q.shape == x.shape
    assert torch.equal(q.codes.reshape(16, 32), nvfp4.quantize(x.reshape(16, 64)).codes)
    assert q.dequantize().shape == x.shape


def test_zeros_and_zero_blocks():
    x = torch.zeros(16, 32)
    q = nvfp4.quantize(x)
    assert q.amax == 0 and q.global_decode_scale == 1.0  # TE's kernel rule: s_enc = 1 when amax = 0
    assert not q.codes.any() and not q.scales.view(torch.uint8).any()
    x[3, 20] = 5.0  # one non-zero block; the others stay exact zeros (no NaN from 0 * FLT_MAX)
    d = nvfp4.quantize(x).dequantize()
    assert torch.isfinite(d).all() and d.count_nonzero() == 1 and d[3, 20] == pytest.approx(5.0, rel=1e-6)


def test_sign_of_zero_follows_te():
    x = torch.zeros(1, 16)
    x[0, 0] = 448.0 * 6  # sets the scale so that tiny values round to zero
    x[0, 1], x[0, 2], x[0, 3] = -0.0, -1e-6, 1e-6
    codes = nvfp4.quantize(x).unpacked_codes()[0]
    assert codes[1] == 0x0 and codes[2] == 0x8 and codes[3] == 0x0


def test_block_amax_clips_when_its_scale_rounds_down():
    # amax = 2688 makes s_enc = 1, so a block of amax 6.36 wants scale 1.06, which E4M3 rounds
    # down to 1.0: amax_b * enc_b = 6.36 > 6 and satfinite clips it to 6 (TE does not compensate).
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 16] = 2688.0, 6.36
    q = nvfp4.quantize(x)
    assert q.global_decode_scale == 1.0 and q.scales[0, 1].to(torch.float32) == 1.0
    assert q.unpacked_codes()[0, 16] == 0x7  # +6, the clipped maximum
    assert q.dequantize()[0, 16] == 6.0


def test_block_scale_underflow_flushes_block_to_zero():
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0
    x[0, 16:] = 1e-7  # target scale 1e-7 * 448 << 2^-10: flushes to E4M3 zero
    q = nvfp4.quantize(x)
    assert q.scales.view(torch.uint8)[0, 1] == 0
    d = q.dequantize()
    assert torch.isfinite(d).all() and not d[0, 16:].any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_non_finite_input_never_becomes_finite(bad, rounding):
    x = torch.randn(16, 64)
    x[5, 7] = bad
    q = nvfp4.quantize(x, tile=(1, 16), rounding=rounding)
    assert not torch.isfinite(q.amax)
    assert torch.isnan(q.global_decode_scale)
    assert torch.isnan(q.scales.to(torch.float32)).all()
    assert torch.isnan(q.dequantize()).all()
    assert torch.isnan(q.dequantize(apply_global_scale=False)).all()
    values, s_dec = nvfp4.fake_quantize(x.to(torch.bfloat16), tile=(16, 16), rounding=rounding)
    assert torch.isnan(values).all() and torch.isnan(s_dec)


def test_nbytes_reports_packed_storage():
    q = nvfp4.quantize(torch.randn(256, 512))
    assert q.nbytes == 256 * 256 + 256 * 32 + 4  # 4.5 bits per element + one FP32
    assert q.nbytes * 8 / (256 * 512) == pytest.approx(4.5, abs=1e-3)


@pytest.mark.parametrize(
    "kwargs, x, error, match",
    [
        (dict(tile=(1, 32)), torch.randn(16, 32), ValueError, "tile"),
        (dict(rounding="nearest"), torch.randn(16, 32), ValueError, "rounding"),
        ({}, torch.randn(16, 24), ValueError, "multiple of 16"),
        (dict(tile=(16, 16)), torch.randn(8, 32), ValueError, "multiple of 16"),
        (dict(tile=(16, 16)), torch.randn(32), ValueError, "dim"),
        ({}, torch.randn(16, 32, dtype=torch.float64), TypeError, "dtype"),
        ({}, torch.randn(0, 32), ValueError, "non-empty"),
    ],
)
def test_bad_input_raises_one_clear_error(kwargs, x, error, match):
    with pytest.raises(error, match=match):
        nvfp4.quantize(x, **kwargs)
    with pytest.raises(error, match=match):
        nvfp4.fake_quantize(x, **kwargs)


def test_e2m1_pack_unpack_roundtrip_and_layout():
    codes = torch.arange(16, dtype=torch.uint8).repeat(2).reshape(2, 16)
    packed = e2m1.pack(codes)
    assert packed[0, 0] == 0x10 and packed[0, 1] == 0x32  # element 2j in the low nibble
    assert torch.equal(e2m1.unpack(packed), codes)
    assert e2m1.decode(torch.tensor([8], dtype=torch.uint8)).item() == 0.0
    assert torch.signbit(e2m1.decode(torch.tensor([8], dtype=torch.uint8))).item()


def test_emulated_gemm_protocol_applies_global_scales_after_the_matmul():
    """The contract the precision layer builds on: matmul the fake-quantized operands (exact
    in bf16), then multiply by both global decode scales, equals the GEMM of the dequantized tensors."""
    gen = torch.Generator().manual_seed(0)
    a, w = torch.randn(32, 64, generator=gen) * 5, torch.randn(48, 64, generator=gen) * 0.02
    va, sa = nvfp4.fake_quantize(a.to(torch.bfloat16), (1, 16))
    vw, sw = nvfp4.fake_quantize(w.to(torch.bfloat16), (16, 16))
    y = (va.double() @ vw.double().T) * (sa.double() * sw.double())
    qa, qw = nvfp4.quantize(a.to(torch.bfloat16), (1, 16)), nvfp4.quantize(w.to(torch.bfloat16), (16, 16))
    y_ref = qa.dequantize(torch.float64) @ qw.dequantize(torch.float64).T
    # (dequantize rounds each element's s_dec product to FP32: agreement to FP32 precision)
    assert torch.allclose(y, y_ref, rtol=0, atol=1e-6 * float(y.abs().max()))
    # And the quantized GEMM is a fair approximation of the real one (NVFP4 error ~10% per element).
    exact = a.double() @ w.double().T
    assert (y - exact).norm() / exact.norm() < 0.15
