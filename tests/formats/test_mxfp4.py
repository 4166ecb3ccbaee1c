"""MXFP4: power-of-two scales by the paper's ceil rule and the OCP floor rule, nearest-element
rounding, fake == packed, non-finite blocks, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nvfp4train.formats import mxfp4, sr_generator

from .strategies import E2M1_GRID, nearest_even, tensors


def exponents(q: mxfp4.MXFP4Tensor) -> torch.Tensor:
    return q.scales.view(torch.uint8).long() - 127


@settings(max_examples=50, deadline=None)
@given(x=tensors(), scale_rule=st.sampled_from(["rceil", "floor"]))
def test_scales_follow_the_rule_and_elements_are_nearest(x, scale_rule):
    q = mxfp4.quantize(x, scale_rule=scale_rule)
    rows, cols = x.shape
    assert q.codes.shape == (rows, cols // 2) and q.scales.shape == (rows, cols // 32)
    assert q.scales.dtype == torch.float8_e8m0fnu
    amax_b = x.to(torch.float64).abs().reshape(rows, -1, 32).amax(-1)
    e = exponents(q)
    scale = torch.pow(2.0, e.double())
    assert torch.equal(q.scales.to(torch.float64), scale)
    live = (amax_b > 0) & (e > -127) & (e < 127)  # away from the E8M0 clamps
    if scale_rule == "rceil":  # the smallest power of two with 6 * X >= amax_b: no saturation
        assert bool((6 * scale >= amax_b).all())
        assert bool((6 * scale[live] / 2 < amax_b[live]).all())
    else:  # OCP: amax_b / X in [4, 8)
        ratio = amax_b[live] / scale[live]
        assert bool(((ratio >= 4) & (ratio < 8)).all())
    assert bool((e[amax_b == 0] == -127).all())
    y = (x.to(torch.float32).reshape(rows, -1, 32) / q.scales.to(torch.float32).unsqueeze(-1)).clamp(-6, 6)
    codes = q.unpacked_codes()
    assert torch.equal((codes & 7).long().reshape(-1), nearest_even(E2M1_GRID, y.abs()))
    assert torch.equal(codes >> 3 == 1, y.reshape(rows, cols) < 0)


@settings(max_examples=30, deadline=None)
@given(x=tensors(), rounding=st.sampled_from(["rne", "sr"]), scale_rule=st.sampled_from(["rceil", "floor"]))
def test_fake_quantize_equals_packed_path_bit_for_bit(x, rounding, scale_rule):
    q = mxfp4.quantize(x, rounding=rounding, scale_rule=scale_rule, generator=sr_generator(7))
    values, g = mxfp4.fake_quantize(
        x, rounding=rounding, scale_rule=scale_rule, generator=sr_generator(7), out_dtype=torch.float32
    )
    assert g == 1.0 and q.global_decode_scale == 1.0
    assert torch.equal(values.view(torch.int32), q.dequantize().view(torch.int32))
    values_bf16, _ = mxfp4.fake_quantize(
        x, rounding=rounding, scale_rule=scale_rule, generator=sr_generator(7), out_dtype=torch.bfloat16
    )
    assert torch.equal(values_bf16.to(torch.float32).view(torch.int32), values.view(torch.int32))


def test_rceil_rule_avoids_the_saturation_the_floor_rule_has():
    x = torch.zeros(1, 32)
    x[0, 0] = 7.0  # rceil: X = 2 (amax -> 3.5 -> 4 by RNE); floor: X = 1 (7 clips to 6)
    assert mxfp4.quantize(x, scale_rule="rceil").dequantize()[0, 0] == 8.0
    assert mxfp4.quantize(x, scale_rule="floor").dequantize()[0, 0] == 6.0


def test_rceil_is_the_round_up_rule_and_the_former_name_ceil_is_refused():
    """rceil = 2^ceil(log2(amax_b / 6)) (torchao RCEIL), not torchao's CEIL 2^(ceil(log2 amax_b) - 2):
    amax 5 gives X = 1 (5 fits under 6), where CEIL would give X = 2. "ceil" (this rule's former name) is
    refused in one line naming the allowed rules."""
    x = torch.zeros(2, 32)
    x[0, 0], x[1, 0] = 5.0, 7.0
    q = mxfp4.quantize(x, scale_rule="rceil")
    assert exponents(q)[:, 0].tolist() == [0, 1] and q.scale_rule == "rceil"
    with pytest.raises(ValueError, match=r"scale_rule='ceil' is not supported; allowed: \('rceil', 'floor'\)"):
        mxfp4.quantize(x, scale_rule="ceil")


def test_non_finite_block_becomes_nan_and_other_blocks_are_untouched():
    x = torch.randn(4, 64)
    clean = mxfp4.quantize(x).dequantize()
    x[1, 40] = float("nan")
    x[2, 3] = float("inf")
    d = mxfp4.quantize(x).dequantize()
    assert torch.isnan(d[1, 32:]).all() and torch.isnan(d[2, :32]).all()
    mask = torch.ones_like(d, dtype=torch.bool)
    mask[1, 32:] = False
    mask[2, :32] = False
    assert torch.equal(d[mask], clean[mask])
    assert q_bits(x)[1, 1] == 0xFF and q_bits(x)[2, 0] == 0xFF


def q_bits(x):
    return mxfp4.quantize(x).scales.view(torch.uint8)


def test_nbytes_is_4_25_bits_per_element():
    q = mxfp4.quantize(torch.randn(64, 256))
    assert q.nbytes * 8 / (64 * 256) == pytest.approx(4.25)


@pytest.mark.parametrize(
    "kwargs, x, match",
    [
        (dict(scale_rule="round"), torch.randn(4, 32), "scale_rule"),
        (dict(rounding="stochastic"), torch.randn(4, 32), "rounding"),
        ({}, torch.randn(4, 48), "multiple of 32"),
    ],
)
def test_bad_input_raises_one_clear_error(kwargs, x, match):
    with pytest.raises(ValueError, match=match):
        mxfp4.quantize(x, **kwargs)
