"""Stochastic rounding: unbiased, lower error when averaged, 1/sqrt(n) convergence,
reproducible from a seed, independent across streams."""

from __future__ import annotations

import pytest
import torch

from nvfp4train.formats import e2m1, mxfp4, nvfp4, sr_generator
from nvfp4train.formats.rounding import stream_seed


def rmse(a, b):
    return float((a.double() - b.double()).pow(2).mean().sqrt())


@pytest.fixture(scope="module")
def x():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0))


def test_e2m1_sr_probability_equals_distance_fraction():
    # 0.3 lies between 0 and 0.5 (P(up) = 0.6); 2.75 between 2 and 3 (0.75); 5.0 between 4 and 6 (0.5).
    gen = sr_generator(1)
    n = 200_000
    for value, lo, hi in [(0.3, 0.0, 0.5), (2.75, 2.0, 3.0), (5.0, 4.0, 6.0), (-1.2, -1.0, -1.5)]:
        _, magnitude = e2m1.round_scaled(torch.full((n,), value), "sr", gen)
        assert set(magnitude.unique().tolist()) <= {abs(lo), abs(hi)}
        p_up = (value - lo) / (hi - lo)
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
    # Unbiased: the mean signed error over all elements is ~0 (well below the per-draw noise).
    bias = float((draws.mean(0) - expectation).mean())
    assert abs(bias) < 5 * err_256 / (x.numel() ** 0.5)


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
    """SR adds 21 random bits below the E2M1 step (after a + 2 * binade) and truncates: all-zero
    bits always round down, all-one bits round up unless the value is on the grid, and a value
    k/2^21 of a step above a grid point rounds up for exactly k of the 2^21 bit patterns."""
    values = torch.tensor([0.3, 0.5, 1.2, 2.75, 3.0, 5.0, 5.99, 6.0, 0.0])
    below = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 4.0, 6.0, 0.0])
    above = torch.tensor([0.5, 0.5, 1.5, 3.0, 3.0, 6.0, 6.0, 6.0, 0.0])
    zeros = torch.zeros(values.shape, dtype=torch.int32)
    ones = torch.full(values.shape, (1 << 21) - 1, dtype=torch.int32)
    assert torch.equal(e2m1.round_magnitude_(values.clone(), "sr", random_bits=zeros), below)
    assert torch.equal(e2m1.round_magnitude_(values.clone(), "sr", random_bits=ones), above)
    # 2 + 3 / 2^21 (step 1 in [2, 4)): rounds up iff random_bits >= 2^21 - 3, i.e. for 3 patterns.
    y = torch.full((8,), 2.0 + 3 * 2.0**-21)
    bits = torch.arange((1 << 21) - 5, (1 << 21) + 3, dtype=torch.int32)  # the last 3 wrap to 0, 1, 2
    up = e2m1.round_magnitude_(y, "sr", random_bits=bits) == 3.0
    assert up.tolist() == [False, False, True, True, True, False, False, False]


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
    bits = torch.randint(0, 2**21, y.shape, dtype=torch.int32, generator=torch.Generator().manual_seed(2))
    pos = e2m1.round_signed_(y.clone(), "sr", random_bits=bits)
    neg = e2m1.round_signed_(-y, "sr", random_bits=bits)
    assert torch.equal(pos, -neg)
    assert set(pos.abs().unique().tolist()) <= set(e2m1.E2M1_MAGNITUDES)
