"""Stochastic rounding: unbiased, lower error when averaged, 1/sqrt(n) convergence,
reproducible from a seed, independent across streams."""

from __future__ import annotations

import math

import pytest
import torch

from nvfp4train.formats import e2m1, mxfp4, nvfp4, sr_generator
from nvfp4train.formats.rounding import stream_seed


def rmse(a, b):
    return float((a.double() - b.double()).pow(2).mean().sqrt())


@pytest.fixture(scope="module")
def x():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0))


def p_up_8bit(value: float, lo: float, hi: float) -> float:
    """SR's P(round up) with 8 random bits (TE's cvt.rs): floor(256 f) / 256 for the fraction f of
    the step, f taken from the FP32 value."""
    f = (float(torch.tensor(value, dtype=torch.float32)) - lo) / (hi - lo)
    return math.floor(256 * f) / 256


def test_e2m1_sr_probability_equals_distance_fraction():
    # 0.3 lies between 0 and 0.5 (f = 0.6); 2.75 between 2 and 3 (0.75); 5.0 between 4 and 6 (0.5).
    gen = sr_generator(1)
    n = 200_000
    for value, lo, hi in [(0.3, 0.0, 0.5), (2.75, 2.0, 3.0), (5.0, 4.0, 6.0), (-1.2, -1.0, -1.5)]:
        _, magnitude = e2m1.round_scaled(torch.full((n,), value), "sr", gen)
        assert set(magnitude.unique().tolist()) <= {abs(lo), abs(hi)}
        p_up = p_up_8bit(value, lo, hi)
        frac = float((magnitude == abs(hi)).double().mean())
        assert abs(frac - p_up) < 5 * (p_up * (1 - p_up) / n) ** 0.5, (value, frac, p_up)
    # Grid points are never moved.
    _, magnitude = e2m1.round_scaled(torch.tensor([0.0, 0.5, 1.5, 3.0, 6.0, 7.5]), "sr", gen)
    assert magnitude.tolist() == [0.0, 0.5, 1.5, 3.0, 6.0, 6.0]


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
def test_mean_of_50_sr_quantizations_beats_one_rne(x, tile):
    """TE's SR oracle (test_nvfp4_sr_quantize.py), on the dequantized values."""
    rne = nvfp4.quantize(x, tile=tile).dequantize()
    gen = sr_generator(2)
    mean_sr = torch.stack(
        [nvfp4.quantize(x, tile=tile, rounding="sr", generator=gen).dequantize() for _ in range(50)]
    ).mean(0)
    assert rmse(mean_sr, x) < 0.5 * rmse(rne, x)


def test_sr_error_of_the_mean_shrinks_like_one_over_sqrt_n(x):
    """Against SR's expectation (the clamped, scaled input: the block scales are RNE and the same
    every draw), the error of the mean of n draws falls like 1/sqrt(n): 16x the draws, 4x less."""
    values_rne, s_dec = nvfp4.fake_quantize(x)
    q = nvfp4.quantize(x)
    unit = (q.scales.to(torch.float32)).repeat_interleave(16, -1)
    expectation = ((x * torch.reciprocal(unit * s_dec)).clamp(-6, 6) * unit).double()
    gen = sr_generator(3)
    draws = torch.stack([nvfp4.fake_quantize(x, rounding="sr", generator=gen)[0] for _ in range(256)]).double()
    err_16 = rmse(draws[:16].mean(0), expectation)
    err_256 = rmse(draws.mean(0), expectation)
    assert 3.2 < err_16 / err_256 < 4.8, (err_16, err_256)
    # The mean signed error over all elements is ~0 (well below the per-draw noise): 8-bit SR's
    # bias is towards zero, so it cancels between this symmetric input's signs.
    bias = float((draws.mean(0) - expectation).mean())
    assert abs(bias) < 5 * err_256 / (x.numel() ** 0.5)
    # In magnitude it shows: with 8 random bits P(up) = floor(256 f) / 256, on average 1/512 of a
    # step short of f for fractions spread evenly (TE's hardware SR has the same bias). The noise
    # of this mean is ~0.4 / sqrt(256 * 16384) ~ 2e-4 steps; an exact (21-bit) SR would give ~0.
    step = torch.where(expectation.abs() < 2 * unit, 0.5, torch.where(expectation.abs() < 4 * unit, 1.0, 2.0))
    magnitude_bias = float(((draws.mean(0).abs() - expectation.abs()) / (unit * step)).mean())
    assert -3 / 1024 < magnitude_bias < -1 / 1024, magnitude_bias


def test_fixed_seed_reproduces_and_streams_differ(x):
    def codes(seed, stream):
        return nvfp4.quantize(x, rounding="sr", generator=sr_generator(seed, stream)).codes

    assert torch.equal(codes(11, 0), codes(11, 0))
    assert not torch.equal(codes(11, 0), codes(11, 1))
    assert not torch.equal(codes(11, 0), codes(12, 0))
    # The default generator is used when none is given: torch.manual_seed makes it reproducible.
    torch.manual_seed(5)
    a = mxfp4.quantize(x, rounding="sr").codes
    torch.manual_seed(5)
    assert torch.equal(a, mxfp4.quantize(x, rounding="sr").codes)


def test_stream_seeds_are_distinct_and_validated():
    seeds = {stream_seed(0, i) for i in range(10_000)} | {stream_seed(1, i) for i in range(10_000)}
    assert len(seeds) == 20_000 and all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match="non-negative"):
        stream_seed(-1, 0)


def test_sr_draws_are_independent_of_rne_draws_and_do_not_touch_scales(x):
    q_rne = nvfp4.quantize(x)
    q_sr = nvfp4.quantize(x, rounding="sr", generator=sr_generator(4))
    assert torch.equal(q_rne.scales.view(torch.uint8), q_sr.scales.view(torch.uint8))  # scales are always RNE
    assert torch.equal(q_rne.amax, q_sr.amax)
    assert not torch.equal(q_rne.codes, q_sr.codes)


def test_sr_rounds_up_exactly_when_the_random_bits_carry():
    """SR adds a random byte (the low 8 bits of each random word) to the top 8 of the 21 bits
    below the E2M1 step (after a + 2 * binade) and truncates: byte 0 always rounds down, byte 255
    rounds up unless the value is on the grid, the other 24 bits of the word are ignored."""
    values = torch.tensor([0.3, 0.5, 1.2, 2.75, 3.0, 5.0, 5.99, 6.0, 0.0])
    below = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 4.0, 6.0, 0.0])
    above = torch.tensor([0.5, 0.5, 1.5, 3.0, 3.0, 6.0, 6.0, 6.0, 0.0])
    high = torch.randint(-(2**23), 2**23, values.shape, dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    for garbage in (torch.zeros_like(high), high << 8):  # bits 8..31: never used
        zeros = garbage | 0
        ones = garbage | 0xFF
        assert torch.equal(e2m1.round_magnitude_(values.clone(), "sr", random_bits=zeros), below)
        assert torch.equal(e2m1.round_magnitude_(values.clone(), "sr", random_bits=ones), above)


def sr_up_counts(y: torch.Tensor) -> torch.Tensor:
    """For each FP32 value of y: of the 256 random bytes, how many round |y| up (away from zero)."""
    bytes_ = torch.arange(256, dtype=torch.int32)
    rounded = e2m1.round_signed_(y[:, None].expand(-1, 256).clone(), "sr", random_bits=bytes_.expand(len(y), -1))
    lo = e2m1.round_signed_(y.clone(), "sr", random_bits=torch.zeros(y.shape, dtype=torch.int32))
    return (rounded != lo[:, None]).sum(-1)


def test_sr_rounds_up_for_exactly_floor_256_f_of_the_256_bytes():
    """P(round up) = floor(256 f) / 256 with f the fraction of the step above the grid point below
    (TE's u = r8 / 256 rule): exact counts for crafted fractions in each binade, both signs. Biased
    towards zero by less than 1/256 of a step: a fraction below 1/256 never rounds up."""
    for lo, step in ((0.0, 0.5), (1.0, 0.5), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0)):
        cases = []  # (fraction of the step, exact in FP32; expected count)
        for k in (1, 2, 77, 128, 200, 255):
            cases += [(k / 256, k), (k / 256 - 2.0**-21, k - 1), (k / 256 + 2.0**-21, k)]
        cases += [(2.0**-21, 0), (1 / 256 - 2.0**-21, 0), (1 - 2.0**-21, 255), (0.0, 0)]
        fractions = torch.tensor([f for f, _ in cases], dtype=torch.float64)
        y = (lo + fractions * step).to(torch.float32)
        assert torch.equal(((y.double() - lo) / step), fractions)  # the crafted values are exact
        want = torch.tensor([count for _, count in cases])
        assert torch.equal(sr_up_counts(y), want), (lo, step)
        assert torch.equal(sr_up_counts(-y), want), (-lo, step)
    # Saturation: |y| > 6 is clamped to 6 first, a grid point: never moves.
    assert sr_up_counts(torch.tensor([6.5, -100.0])).tolist() == [0, 0]


def test_sr_draws_one_random_word_per_element_from_the_generator():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    gen = sr_generator(9)
    nvfp4.quantize(x, rounding="sr", generator=gen)
    after_one = gen.get_state()
    gen2 = sr_generator(9)
    torch.empty(x.numel() // 2, dtype=torch.int64).random_(-(2**63), None, generator=gen2)
    assert torch.equal(after_one, gen2.get_state())
    # RNE draws nothing.
    gen3 = sr_generator(9)
    nvfp4.quantize(x, generator=gen3)
    assert torch.equal(gen3.get_state(), sr_generator(9).get_state())


def test_sr_is_mirror_symmetric_for_the_same_random_bits():
    y = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 3
    bits = torch.randint(-(2**31), 2**31, y.shape, dtype=torch.int32, generator=torch.Generator().manual_seed(2))
    pos = e2m1.round_signed_(y.clone(), "sr", random_bits=bits)
    neg = e2m1.round_signed_(-y, "sr", random_bits=bits)
    assert torch.equal(pos, -neg)
    assert set(pos.abs().unique().tolist()) <= set(e2m1.E2M1_MAGNITUDES)


@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_nan_of_any_payload_stays_nan(rounding):
    """NaN in, NaN out, whatever its payload: a GPU's NaN is 0x7FFFFFFF, where SR's random byte used to carry
    into the sign bit and leave ±Inf. The values around it still round."""
    words = torch.tensor([0x7FFFFFFF, -1, 0x7FC00000, 0x7F800001, -(2**22)], dtype=torch.int32)
    y = torch.cat([words.view(torch.float32), torch.tensor([0.3, -2.6, 5.9])])
    bits = torch.full(y.shape, 0xFF, dtype=torch.int32)  # the byte that carries the most
    out = e2m1.round_signed_(y.clone(), rounding, random_bits=bits)
    assert out[:5].isnan().all(), out[:5]
    assert set(out[5:].abs().tolist()) <= set(e2m1.E2M1_MAGNITUDES)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    x[1, 7] = words[0].view(torch.float32)
    q = nvfp4.quantize(x, (1, 16), rounding, sr_generator(0, 0), impl="reference")
    assert q.dequantize(torch.float32).isnan().any()
