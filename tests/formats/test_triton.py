"""The Triton quantizers (formats/kernels/) give the PyTorch reference's bits.

Two ways this module runs:
* on a GPU: ``pytest -m gpu tests/formats/test_triton.py`` runs every check on CUDA tensors;
* on CPU: ``test_kernels_in_the_triton_interpreter`` re-runs this file in a subprocess with
  ``TRITON_INTERPRET=1``. Triton reads that variable when a function is decorated with
  ``@triton.jit`` (at import, also for triton.language's own functions), so it must be set before
  triton is imported; a subprocess keeps it away from every other test (an interpreted kernel
  would also replace torch.compile's GPU kernels). The interpreter is slow: shapes are tiny and a
  subset of the golden cases runs there (all of them on the GPU).
The reference always runs on CPU (its bits are the same on every device).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from nvfp4train.formats import fp8, hadamard, mxfp4, nvfp4, sr_generator
from nvfp4train.formats.rounding import random_bits_like

from .conftest import INTERPRETING, golden_manifest, kernel_test, load_golden, rerun_in_triton_interpreter

DEVICE = torch.device("cpu" if INTERPRETING else "cuda")


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_kernels_in_the_triton_interpreter():
    pytest.importorskip("triton")
    summary = rerun_in_triton_interpreter(__file__, timeout=900)
    # Skipped there by design: this test, the GPU compile check and the hardware bf16 rounding check.
    assert re.fullmatch(r"\d+ passed, 3 skipped in .*", summary), summary


def test_triton_on_cpu_needs_the_interpreter_or_says_so():
    x = torch.zeros(16, 32)
    with pytest.raises(ValueError, match="impl="):
        nvfp4.quantize(x, impl="cuda")
    if INTERPRETING:
        return
    pytest.importorskip("triton")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        nvfp4.quantize(x, impl="triton")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        mxfp4.fake_quantize(x, impl="triton")


def test_nvfp4train_triton_0_turns_our_kernels_off(monkeypatch):
    """NVFP4TRAIN_TRITON=0: "auto" runs the PyTorch code for the quantizers, the emulated GEMM's epilogue
    and the Mamba conv (a switch to rule the kernels out); an explicit impl="triton" still runs them."""
    pytest.importorskip("triton")
    from nvfp4train.formats.impl import triton_available, use_triton
    from nvfp4train.model.ssd import triton_conv_available

    assert triton_available() and triton_conv_available()
    monkeypatch.setenv("NVFP4TRAIN_TRITON", "0")
    assert not triton_available() and not triton_conv_available()
    if torch.cuda.is_available():
        x = torch.zeros(16, 32, device="cuda")
        assert not use_triton(x, "auto", "test") and use_triton(x, "triton", "test")


# ------------------------------------------------------------------------------ inputs
def edge_inputs() -> list[torch.Tensor]:
    """FP32 [32, 128] tensors covering the edges: outliers, a row whose scales go E4M3-subnormal,
    zero blocks, signed zeros, negatives that round to -0, grid midpoints (RNE ties), amax at a
    power of two, block maxima spread over 2^-40..2^8 (every E4M3 scale code)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 128, generator=gen)
    x[::7, ::13] *= 300
    x[5] *= 1e-6  # 1x16 scales near 2^-9 (E4M3 subnormal) under this tensor's global scale
    x[9, :16] = 0.0
    x[10, :16] = -0.0
    x[11, 1] = -1e-30
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2)
    x[12, :16] = ties  # block amax 6: y = x exactly when the global amax is 2688 / 448 * 6
    x[13, :16] = -ties
    spread = x.clone()
    spread *= torch.exp2(torch.randint(-40, 8, (32, 8, 1), generator=gen).float()).expand(32, 8, 16).reshape(32, 128)
    pow2 = torch.randn(32, 128, generator=gen)
    pow2[0, 0] = 64.0  # amax a power of two
    grid = x.clamp(-6, 6)
    grid[0, 0] = 6.0  # global amax 6: s_enc = 448, and blocks with amax 6 are quantized unscaled
    return [x, spread, pow2, grid]


def reference_nvfp4(x, tile, rounding="rne", generator=None):
    q = nvfp4.quantize(x.cpu(), tile, rounding, generator, impl="reference")
    return q.codes, q.scales.view(torch.uint8), q.amax, q.global_decode_scale


# NaNs of every payload shape: a GPU writes 0x7FFFFFFF for any NaN it computes, the CPU keeps the payload.
NAN_WORDS = torch.tensor([0x7FFFFFFF, -1, 0x7FC00000, 0x7F800001, -(2**22)], dtype=torch.int32).view(torch.float32)


def assert_same(got, want, what):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # codes by their bytes
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if got.is_floating_point():
        assert torch.equal(got.isnan(), want.isnan()), what
        got, want = got.nan_to_num(0.0), want.nan_to_num(0.0)
        bits = {4: torch.int32, 2: torch.int16}[got.element_size()]
        got, want = got.view(bits), want.view(bits)
    diff = int((got != want).sum())
    assert diff == 0, f"{what}: {diff} of {got.numel()} differ"


# ------------------------------------------------------------------------------ NVFP4
@kernel_test
@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nvfp4_rne_same_bits_as_the_reference(tile, dtype):
    for i, x in enumerate(edge_inputs()):
        x = x.to(dtype)
        want = reference_nvfp4(x, tile)
        q = nvfp4.quantize(x.to(DEVICE), tile, impl="triton")
        for name, got, ref in zip(
            ("codes", "scales", "amax", "s_dec"),
            (q.codes, q.scales.view(torch.uint8), q.amax, q.global_decode_scale),
            want,
        ):
            assert_same(got, ref, f"input {i} {name}")
        for out_dtype in (torch.bfloat16, torch.float32):
            values, s_dec = nvfp4.fake_quantize(x.to(DEVICE), tile, out_dtype=out_dtype, impl="triton")
            ref_values, _ = nvfp4.fake_quantize(x, tile, out_dtype=out_dtype, impl="reference")
            assert_same(values, ref_values, f"input {i} values {out_dtype}")
            assert_same(s_dec, want[3], f"input {i} s_dec")


@kernel_test
@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
def test_nvfp4_sr_with_the_same_random_bits_same_bits(tile):
    from nvfp4train.formats import kernels

    x = edge_inputs()[0].to(torch.bfloat16)
    bits = random_bits_like(x, sr_generator(7))
    want = reference_nvfp4(x, tile, "sr", sr_generator(7))
    got = kernels.nvfp4.quantize(x.to(DEVICE), tile[0], "sr", dense=False, random_bits=bits.to(DEVICE))
    for name, g, w in zip(("codes", "scales", "amax", "s_dec"), got, want):
        assert_same(g, w, name)
    values, _, _ = kernels.nvfp4.quantize(
        x.to(DEVICE), tile[0], "sr", dense=True, random_bits=bits.to(DEVICE), out_dtype=torch.float32
    )
    ref, _ = nvfp4.fake_quantize(x, tile, "sr", sr_generator(7), out_dtype=torch.float32, impl="reference")
    assert_same(values, ref, "values")


@kernel_test
def test_nvfp4_non_finite_and_zero_inputs_follow_the_reference_policy():
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(16, 64)
        x[3, 7] = bad
        q = nvfp4.quantize(x.to(DEVICE), (1, 16), impl="triton")
        assert (q.scales.view(torch.uint8).cpu() == 0x7F).all() and q.global_decode_scale.isnan()
        assert_same(q.codes, reference_nvfp4(x, (1, 16))[0], f"codes with {bad}")
        values, s_dec = nvfp4.fake_quantize(x.to(DEVICE), (16, 16), impl="triton")
        assert values.isnan().all() and s_dec.isnan()
    zeros = torch.zeros(16, 32)
    q = nvfp4.quantize(zeros.to(DEVICE), impl="triton")
    assert not q.codes.cpu().any() and not q.scales.view(torch.uint8).cpu().any()
    assert float(q.amax) == 0.0 and float(q.global_decode_scale) == 1.0


def signed_zero_inputs(dtype) -> torch.Tensor:
    """[32, 64]: blocks of 16 (and 32) with -0.0, negatives that round to -0, and negatives whose product
    with the block's encode scale underflows to -0.0 (a block amax of 1e30 next to -1e-38, or a bf16
    subnormal): the reference's y < 0 is false for those, so their dense values are +0.0."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(11))
    x[0, :16] = -0.0
    x[1, 1] = -0.01  # rounds to -0 (keeps its sign, code 0x8)
    x[2, :32] = -1e-38
    x[2, 0] = 1e30
    x[3, :32] = -(2.0**-133)  # a bf16 subnormal: x * encode underflows
    x[3, 5] = -3e38
    x[4::2, 3] = -0.0
    return x.to(dtype)


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_values_and_codes_keep_signed_zeros_and_nans_as_the_reference(dtype):
    """e2m1.signed_value's sign (from y + 0.0) and its NaN (from the block scale, whatever round_e2m1's
    magnitude): the dense outputs of every E2M1 kernel give the reference's +0.0 / -0.0 bits, and NaN where
    the reference does, for every NaN payload and +-Inf (RNE and SR)."""
    from nvfp4train.formats import kernels

    signs = hadamard.resolve_signs(16)
    inputs = [signed_zero_inputs(dtype)]
    for bad in [*NAN_WORDS.tolist(), float("inf"), -float("inf")]:
        x = signed_zero_inputs(torch.float32)
        x[7, 9] = bad
        inputs.append(x.to(dtype))
    for x in inputs:
        bits = random_bits_like(x, sr_generator(3))
        for rounding in ("rne", "sr"):
            got, _, _ = kernels.nvfp4.quantize(
                x.to(DEVICE), 1, rounding, dense=True, random_bits=bits.to(DEVICE), out_dtype=torch.float32
            )
            want, _ = nvfp4.fake_quantize(
                x, (1, 16), rounding, sr_generator(3), out_dtype=torch.float32, impl="reference"
            )
            assert_same(got, want, f"nvfp4 {rounding}")
            got = kernels.mxfp4.quantize(
                x.to(DEVICE), "rceil", rounding, dense=True, random_bits=bits.to(DEVICE), out_dtype=torch.float32
            )
            want = mxfp4.fake_quantize(x, rounding, "rceil", sr_generator(3), torch.float32, impl="reference")[0]
            assert_same(got, want, f"mxfp4 {rounding}")
            # The Wgrad operand (RHT along tokens, transposed) and its rowwise twin from the same read.
            t_bits = random_bits_like(torch.empty(x.shape[1], x.shape[0]), sr_generator(4))
            got = kernels.rht.nvfp4_t(
                x.to(DEVICE), signs, rounding, dense=True, random_bits=t_bits.to(DEVICE), out_dtype=torch.float32
            )[0]
            want, _ = nvfp4.rht_fake_quantize_t(x, rounding, sr_generator(4), out_dtype=torch.float32, impl="reference")
            assert_same(got, want, f"rht nvfp4 {rounding}")
        (row, _, _), (col, _, _) = kernels.rht.nvfp4_t(
            x.to(DEVICE), signs, "rne", dense=True, rowwise=True, rowwise_dense=True, out_dtype=torch.float32
        )
        want_row, _ = nvfp4.fake_quantize(x, (1, 16), out_dtype=torch.float32, impl="reference")
        want_col, _ = nvfp4.rht_fake_quantize_t(x, out_dtype=torch.float32, impl="reference")
        assert_same(row, want_row, "rowwise of the fused kernel")
        assert_same(col, want_col, "columnwise of the fused kernel")
        # Packed codes: e2m1.masked_codes clears whole blocks whose scale is NaN (the reference's code 0 for
        # every NaN y), where round_e2m1 leaves a NaN's index unspecified; the signs of zeros as above.
        for rounding in ("rne", "sr"):
            got = kernels.nvfp4.quantize(x.to(DEVICE), 1, rounding, dense=False, random_bits=bits.to(DEVICE))[0]
            want = nvfp4.quantize(x, (1, 16), rounding, sr_generator(3), impl="reference").codes
            assert_same(got, want, f"nvfp4 codes {rounding}")
            got = kernels.mxfp4.quantize(x.to(DEVICE), "rceil", rounding, dense=False, random_bits=bits.to(DEVICE))[0]
            want = mxfp4.quantize(x, rounding, "rceil", sr_generator(3), impl="reference").codes
            assert_same(got, want, f"mxfp4 codes {rounding}")
            got = kernels.rht.nvfp4_t(x.to(DEVICE), signs, rounding, dense=False, random_bits=t_bits.to(DEVICE))[0]
            want = nvfp4.rht_quantize_t(x, rounding, sr_generator(4), impl="reference").codes
            assert_same(got, want, f"rht nvfp4 codes {rounding}")
        (row, *_), (col, *_) = kernels.rht.nvfp4_t(x.to(DEVICE), signs, "rne", dense=False, rowwise=True)
        assert_same(row, nvfp4.quantize(x, (1, 16), impl="reference").codes, "rowwise codes of the fused kernel")
        assert_same(col, nvfp4.rht_quantize_t(x, impl="reference").codes, "columnwise codes of the fused kernel")


@kernel_test
def test_nvfp4_global_scales_of_partial_maxima_as_the_reference():
    """global_scales_of (one program a row, looping over the partials): amax = the max of the partial
    maxima's bits, s_dec and s_enc * fp32(1/6) as nvfp4._quantize_core computes them from it, for rows
    longer than its block (3000 partials), a row of zeros, subnormal and huge maxima, +Inf and NaN."""
    from nvfp4train.formats import kernels

    gen = torch.Generator().manual_seed(8)
    maxima = torch.rand(7, 3000, generator=gen) * torch.exp2(torch.randint(-130, 120, (7, 1), generator=gen).float())
    maxima[0] = 0.0
    maxima[1, 2999] = 3.0e38  # the row's max in the last block
    maxima[2] = 1e-40  # subnormal amax: s_enc overflows to the FLT_MAX cap
    maxima[3, 1500] = float("inf")
    maxima[4, 7] = float("nan")
    maxima[5, 2500] = NAN_WORDS[0]
    bits = maxima.view(torch.int32)
    for rows in (bits[:2], bits[2:4], bits[4:6], bits[6:]):
        got, outs = kernels.nvfp4.global_scales_of(rows.to(DEVICE))
        amax = rows.amax(dim=1).view(torch.float32)
        s_enc = nvfp4.global_encode_scale(amax)
        want = torch.stack([amax, torch.reciprocal(s_enc), s_enc * torch.reciprocal(torch.full_like(s_enc, 6.0))], 1)
        assert_same(got, want, "(amax, s_dec, s_enc / 6)")
        assert_same(torch.stack([torch.stack(pair) for pair in outs]), want[:, :2], "the 0-d outputs")


@kernel_test
def test_abs_max_bits_by_signed_and_unsigned_maxima():
    """common.abs_max_bits (max |v| from the signed and the unsigned maximum of the words, no mask an
    element) is the maximum of bits & 0x7FFFFFFF: tiles all negative, all positive, mixed, with -0.0 only,
    +-Inf, subnormals, and NaNs of every payload and both signs (a NaN's magnitude above +Inf's)."""
    from . import sr_kernels

    gen = torch.Generator().manual_seed(12)
    tiles = [torch.randn(512, generator=gen) * 10.0 ** torch.randint(-40, 38, (1,), generator=gen).item()]
    tiles += [-tiles[0].abs(), tiles[0].abs(), torch.full((512,), -0.0), torch.zeros(512)]
    for special in [float("inf"), -float("inf"), 1e-45, -1e-45, -3e38, *NAN_WORDS.tolist()]:
        for base in (tiles[0], -tiles[0].abs(), tiles[0].abs() * 1e-30):
            t = base.clone()
            t[int(torch.randint(0, 512, (1,), generator=gen))] = special
            tiles.append(t)
    v = torch.stack(tiles)
    out = torch.empty(len(tiles), dtype=torch.int32, device=DEVICE)
    sr_kernels.abs_max_bits_kernel[(len(tiles),)](v.to(DEVICE), out)
    assert_same(out, (v.view(torch.int32) & 0x7FFFFFFF).amax(dim=1), "max |v| bits")


@kernel_test
def test_e4m3_rne_of_every_code_midpoint_and_subnormal():
    """e4m3_rne (the NVFP4 block scales: normal codes from FP32's rounded word, subnormal ones from
    s + 2^14) gives torch's .to(float8_e4m3fn) bits and values for every E4M3 value in [0, 448], every
    midpoint between neighbours (ties to even) and the FP32 neighbours of both, values below the smallest
    subnormal, the normal/subnormal boundary 2^-6 and random values; NaN of every payload gives 0x7F."""
    from . import sr_kernels

    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # codes 0..126: 0..448
    mids = (grid[1:] + grid[:-1]) / 2
    points = torch.cat([grid, mids, torch.tensor([2.0**-6, 2.0**-10, 2.0**-11, 2.0**-12, 1e-30, 2.0**-149])])
    points = torch.cat(
        [points, torch.nextafter(points, torch.zeros(1)), torch.nextafter(points, torch.full((1,), 448.0))]
    )
    s = torch.cat([points, torch.rand(4096, generator=torch.Generator().manual_seed(9)) * 448, torch.zeros(1)])
    s = s.clamp(0, 448)
    s = torch.cat([s, NAN_WORDS])
    s = torch.cat([s, torch.zeros((-s.numel()) % 1024)])
    codes = torch.empty(s.shape, dtype=torch.int32, device=DEVICE)
    values = torch.empty(s.shape, dtype=torch.float32, device=DEVICE)
    sr_kernels.e4m3_rne_kernel[(s.numel() // 1024,)](s.to(DEVICE), codes, values, N=1024)
    want = s.to(torch.float8_e4m3fn)
    finite = ~s.isnan()
    assert_same(codes.cpu()[finite], want.view(torch.uint8).to(torch.int32)[finite], "codes")
    assert (codes.cpu()[~finite] == 0x7F).all()
    assert_same(values, want.float(), "values")


@kernel_test
def test_nvfp4_hypothesis_inputs_same_bits():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from .strategies import tensors

    @settings(max_examples=6 if INTERPRETING else 60, deadline=None, derandomize=True)
    @given(tensors(), st.sampled_from([(1, 16), (16, 16)]))
    def check(x, tile):
        q = nvfp4.quantize(x.to(DEVICE), tile, impl="triton")
        want = reference_nvfp4(x, tile)
        for name, got, ref in zip(
            ("codes", "scales", "amax", "s_dec"),
            (q.codes, q.scales.view(torch.uint8), q.amax, q.global_decode_scale),
            want,
        ):
            assert_same(got, ref, name)

    check()


def golden_subset(fmt: str) -> list[str]:
    names = [c["name"] for c in golden_manifest()["cases"] if c["format"] == fmt]
    return names[::12] if INTERPRETING else names


@kernel_test
def test_nvfp4_golden_vectors():
    manifest, tensors = load_golden()
    for name in golden_subset("nvfp4"):
        meta = next(c for c in manifest["cases"] if c["name"] == name)
        x, tile = tensors[f"{name}/x"], tuple(meta["tile"])
        columnwise = hadamard.rht(x.t(), d=16) if meta["rht_on_columnwise"] else x.t()
        for which, xx in (("rowwise", x), ("columnwise", columnwise)):
            q = nvfp4.quantize(xx.to(DEVICE), tile, impl="triton")
            assert_same(q.codes, tensors[f"{name}/{which}_codes"], f"{name} {which} codes")
            assert_same(q.scales.view(torch.uint8), tensors[f"{name}/{which}_scales_e4m3"], f"{name} {which} scales")
            assert_same(q.amax.reshape(1), tensors[f"{name}/amax_{which}"], f"{name} {which} amax")


# ------------------------------------------------------------------------------ Philox SR
@kernel_test
def test_philox_sr_is_reproducible_per_seed_and_advances_the_generator():
    x = edge_inputs()[0].to(DEVICE)

    def codes(generator):
        return nvfp4.quantize(x, (1, 16), "sr", generator, impl="triton").codes.cpu()

    assert torch.equal(codes(sr_generator(1, 0, DEVICE)), codes(sr_generator(1, 0, DEVICE)))
    assert not torch.equal(codes(sr_generator(1, 0, DEVICE)), codes(sr_generator(2, 0, DEVICE)))
    gen = sr_generator(1, 0, DEVICE)
    assert not torch.equal(codes(gen), codes(gen))
    # quantize and fake_quantize draw the same way: the same generator state, the same numbers.
    q = nvfp4.quantize(x, (16, 16), "sr", sr_generator(3, 0, DEVICE), impl="triton")
    values, _ = nvfp4.fake_quantize(
        x, (16, 16), "sr", sr_generator(3, 0, DEVICE), out_dtype=torch.float32, impl="triton"
    )
    assert_same(values, q.dequantize(apply_global_scale=False).cpu(), "fake vs quantize")


@kernel_test
@pytest.mark.parametrize("tile_rows", [1, 16])
def test_nvfp4_philox_sr_draws_the_bytes_of_philox_rows(tile_rows):
    """The row-wise NVFP4 kernel's Philox SR gives each element the byte philox_rows gives its index: the
    same outputs as SR with those bytes as explicit random bits, codes and dense values, partial tiles
    included."""
    from nvfp4train.formats import kernels

    from . import sr_kernels

    seed = torch.tensor([4242], device=DEVICE)
    for x in (edge_inputs()[1], torch.randn(48, 80, generator=torch.Generator().manual_seed(5))):
        x = x.to(torch.bfloat16).to(DEVICE)
        rows, cols = x.shape
        bits = torch.empty(rows, cols, dtype=torch.int32, device=DEVICE)
        sr_kernels.philox_rows_kernel[(rows // 16, cols // 16)](seed, bits, cols, BLOCK_R=16, BLOCK_C=16)
        for dense in (False, True):
            kw = dict(dense=dense, out_dtype=torch.float32)
            got = kernels.nvfp4.quantize(x, tile_rows, "sr", seed=seed, **kw)
            want = kernels.nvfp4.quantize(x, tile_rows, "sr", random_bits=bits, **kw)
            for i, (g, w) in enumerate(zip(got, want)):
                assert_same(g, w.cpu(), f"{tuple(x.shape)} dense={dense} output {i}")


@kernel_test
def test_philox_sr_rounds_up_with_probability_floor_256_f_over_256():
    """Blocks [6, v, v, ...] with a global amax of 6 quantize v unscaled (s_enc = 448, scale 448,
    encode 1), so P(v rounds up) must be floor(256 f) / 256 for f = (v - lo) / (hi - lo) (8 random
    bits, TE's cvt.rs)."""
    n_blocks = 256
    for v, lo, hi in [(0.3, 0.0, 0.5), (2.75, 2.0, 3.0), (-5.0, -4.0, -6.0)]:
        x = torch.full((n_blocks, 16), v)
        x[:, 0] = 6.0
        values, s_dec = nvfp4.fake_quantize(
            x.to(DEVICE), rounding="sr", generator=sr_generator(5, 0, DEVICE), out_dtype=torch.float32, impl="triton"
        )
        assert torch.equal(s_dec.cpu(), torch.tensor(1 / 448))
        drawn = (values.cpu() / 448)[:, 1:]  # values = e2m1 * scale 448
        assert set(drawn.unique().tolist()) <= {lo, hi}, (v, drawn.unique())
        f = (float(torch.tensor(v, dtype=torch.float32)) - lo) / (hi - lo)
        p_up, n = math.floor(256 * f) / 256, drawn.numel()
        frac = float((drawn == hi).double().mean())
        assert abs(frac - p_up) < 5 * (p_up * (1 - p_up) / n) ** 0.5, (v, frac, p_up)
        # A row is one Philox call (16 elements, 16 different bytes): decisions within a word's 4
        # bytes and across the row are independent (alike with probability p^k + (1-p)^k, 1 if they
        # shared a byte).
        up = drawn[:, 3:] == hi  # elements 4..15 of each row: 3 whole words
        words = up.reshape(-1, 4)
        alike = words.all(-1) | (~words).all(-1)
        assert float(alike.double().mean()) < p_up**4 + (1 - p_up) ** 4 + 0.1, v
        row_alike = up.all(-1) | (~up).all(-1)
        assert float(row_alike.double().mean()) < p_up**12 + (1 - p_up) ** 12 + 0.05, v


@kernel_test
def test_philox_bytes_depend_on_the_output_index_only():
    """The Philox bits are defined per output index n: byte n % 4 of word (n // 4) % 4 of counter
    n // 16 (randint4x). _philox_rows (any tile) and e2m1.random_bits_t (the Wgrad kernels' [GROUPS,
    D, BLOCK_F] tile of the [features, tokens] output) give exactly those bytes."""
    from . import sr_kernels

    rows, cols = 16, 256
    total = rows * cols
    seed = torch.tensor([12345], device=DEVICE)
    words = torch.empty(4, total // 16, dtype=torch.int32, device=DEVICE)
    sr_kernels.philox_words_kernel[(1,)](seed, words, N=total // 16)
    n = torch.arange(total)
    byte_of = words.cpu()[(n // 4) % 4, n // 16]
    want = ((byte_of >> (8 * (n % 4))) & 0xFF).to(torch.int32)
    assert 200 < len(want.unique()) and not torch.equal(want[0::4], want[1::4])
    for block_r, block_c in ((16, 256), (4, 64), (1, 16), (2, 32)):
        got = torch.full((rows, cols), -1, dtype=torch.int32, device=DEVICE)
        sr_kernels.philox_rows_kernel[(rows // block_r, cols // block_c)](
            seed, got, cols, BLOCK_R=block_r, BLOCK_C=block_c
        )
        assert_same(got.reshape(-1), want, f"_philox_rows {block_r}x{block_c}")
        sr_kernels.philox_rows_kernel[(rows // block_r, cols // block_c)](
            seed, got, cols, BLOCK_R=block_r, BLOCK_C=block_c, SHIFT=13
        )
        assert_same(got.reshape(-1), want << 13, f"_philox_rows {block_r}x{block_c}, the bytes on bits 13..20")
    # The Wgrad tile: output [features, tokens] = [16, 256] (tokens 256 = blocks of D).
    n_features, n_tokens = rows, cols
    for groups, d, block_f in ((4, 16, 4), (1, 16, 16), (2, 32, 8), (8, 32, 1)):
        got = torch.full((n_features, n_tokens), -1, dtype=torch.int32, device=DEVICE)
        grid = (n_tokens // (groups * d), n_features // block_f)
        sr_kernels.rht_random_bits_kernel[grid](seed, got, n_tokens, GROUPS=groups, D=d, BLOCK_F=block_f)
        assert_same(got.reshape(-1), want << 13, f"e2m1.random_bits_t {groups}x{d}x{block_f}")


@kernel_test
def test_sr_bits_round_as_the_reference_bit_for_bit():
    """_round_e2m1 with explicit random words: the reference's codes and values (e2m1.round_signed_)
    for every byte 0..255 on values crafted at k / 256 of a step (+- 2^-21) in every binade, both
    signs, with the words' other 24 bits set at random (unused), and the count of bytes that round up
    is floor(256 f) for each; then the reference's codes and values over the whole range."""
    from nvfp4train.formats import e2m1

    from . import sr_kernels

    # (fraction of the step, bytes that round up)
    cases = [
        (k / 256 + delta, k - (delta < 0)) for k in (1, 3, 100, 128, 255) for delta in (0.0, -(2.0**-21), 2.0**-21)
    ]
    cases += [(2.0**-21, 0), (1 - 2.0**-21, 255)]
    y, counts = [], []
    for lo, step in ((0.0, 0.5), (1.0, 0.5), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0)):
        y += [lo + f * step for f, _ in cases]  # exact in FP32: 21 bits below the step suffice
        counts += [count for _, count in cases]
    y = torch.tensor(y, dtype=torch.float64).to(torch.float32)
    y = torch.cat([y, -y, torch.tensor([6.0, -7.5, 0.0, -0.0, float("nan")])])
    counts = torch.tensor(counts * 2 + [0] * 5)
    ys = y[:, None].expand(-1, 256).contiguous()
    high = torch.randint(-(2**23), 2**23, ys.shape, dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    bits = (high << 8) | torch.arange(256, dtype=torch.int32)
    ys, bits = ys.reshape(-1), bits.reshape(-1)
    # Then values all over the range with random words: binade edges, subnormals, beyond 6.
    gen = torch.Generator().manual_seed(2)
    edges = torch.tensor([0.5, 1.0, 2.0, 4.0, 6.0, 2.0**-126, 2.0**-149, 1e-30])
    others = torch.cat(
        [
            torch.randn(4096, generator=gen) * 3,
            edges,
            torch.nextafter(edges, torch.zeros(1)),
            torch.nextafter(edges, torch.full((1,), 8.0)),
            6.0 + torch.rand(64, generator=gen),
        ]
    )
    others = torch.cat([others, -others, NAN_WORDS])
    ys = torch.cat([ys, others])
    bits = torch.cat([bits, torch.randint(-(2**31), 2**31, others.shape, dtype=torch.int32, generator=gen)])
    pad = (-ys.numel()) % 1024
    ys = torch.cat([ys, torch.zeros(pad)])
    bits = torch.cat([bits, torch.zeros(pad, dtype=torch.int32)])
    codes = torch.empty(ys.shape, dtype=torch.int32, device=DEVICE)
    values = torch.empty(ys.shape, dtype=torch.float32, device=DEVICE)
    sr_kernels.round_e2m1_kernel[(ys.numel() // 1024,)](ys.to(DEVICE), bits.to(DEVICE), codes, values, N=1024)
    rounded = e2m1.round_signed_(ys.clone(), "sr", random_bits=bits)
    assert_same(codes, e2m1.encode_values(rounded).to(torch.int32), "codes")
    assert_same(values, rounded, "values")
    codes = codes.cpu()[: y.numel() * 256].reshape(-1, 256)
    up = (codes != codes[:, :1]).sum(-1)  # byte 0 always rounds down
    assert torch.equal(up, counts), (y[up != counts], up[up != counts], counts[up != counts])


@kernel_test
def test_rne_rounds_as_the_reference_bit_for_bit():
    """_round_e2m1's RNE (index and magnitude from z = |y| + 2^22 offset): the reference's codes and values
    for every grid point, every midpoint (ties to the even code) and its FP32 neighbours, binade edges, subnormals,
    values
    beyond 6, random values, both signs, and NaN."""
    from nvfp4train.formats import e2m1

    from . import sr_kernels

    grid = torch.tensor(e2m1.E2M1_MAGNITUDES)
    points = torch.cat(
        [grid, (grid[1:] + grid[:-1]) / 2, torch.tensor([2.0**-126, 2.0**-149, 1e-30, 6.5, 7.0, 1e30, float("inf")])]
    )
    points = torch.cat(
        [points, torch.nextafter(points, torch.zeros(1)), torch.nextafter(points, torch.full((1,), 8.0))]
    )
    gen = torch.Generator().manual_seed(3)
    ys = torch.cat([points, torch.randn(4096, generator=gen) * 3, torch.rand(4096, generator=gen) * 6])
    ys = torch.cat([ys, -ys, torch.tensor([0.0, -0.0]), NAN_WORDS])
    ys = torch.cat([ys, torch.zeros((-ys.numel()) % 1024)])
    codes = torch.empty(ys.shape, dtype=torch.int32, device=DEVICE)
    values = torch.empty(ys.shape, dtype=torch.float32, device=DEVICE)
    sr_kernels.round_e2m1_kernel[(ys.numel() // 1024,)](
        ys.to(DEVICE), torch.zeros_like(ys, dtype=torch.int32).to(DEVICE), codes, values, N=1024, ROUNDING=0
    )
    rounded = e2m1.round_signed_(ys.clone(), "rne")
    assert_same(codes, e2m1.encode_values(rounded).to(torch.int32), "codes")
    assert_same(values, rounded, "values")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(INTERPRETING, reason="the interpreter runs no hardware conversion (on a GPU machine too)")
def test_hardware_bf16_rounding_equals_the_bit_arithmetic():
    """_round_to's HW_BF16 (the GPU's cvt.rn.bf16.f32, used by the RHT kernels on sm_80+) gives the bit
    arithmetic's values (torch's .to(bfloat16)) for ties both ways, subnormals, overflow, zeros, infinities
    and random words; NaN stays NaN (its payload may differ)."""
    from . import sr_kernels

    gen = torch.Generator().manual_seed(5)
    words = torch.randint(-(2**31), 2**31, (1 << 16,), dtype=torch.int64, generator=gen).to(torch.int32)
    ties = (words & ~0xFFFF) | 0x8000  # exactly halfway: even and odd bf16 mantissas
    near = torch.cat([ties + 1, ties - 1])
    special = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            -float("inf"),
            float("nan"),
            3.3895314e38,
            -3.3895314e38,
            3.4028235e38,
            1e-45,
            -1e-45,
            1.1754942e-38,
            9.2e-41,
        ]
    ).view(torch.int32)
    v = torch.cat([words, ties, near, special]).view(torch.float32)
    v = torch.cat([v, torch.zeros((-v.numel()) % 1024)]).cuda()
    outs = []
    for hw in (True, False):
        out = torch.empty_like(v)
        sr_kernels.round_to_bf16_kernel[(v.numel() // 1024,)](v, out, N=1024, HW_BF16=hw)
        outs.append(out.cpu())
    assert_same(outs[0], outs[1], "hardware vs bit-arithmetic bf16 rounding")
    assert_same(outs[0], v.cpu().to(torch.bfloat16).float(), "hardware vs torch")


@kernel_test
def test_philox_sr_is_unbiased():
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    q = nvfp4.quantize(x, impl="triton")
    unit = q.scales.to(torch.float32).repeat_interleave(16, -1)
    expectation = ((x * torch.reciprocal(unit * q.global_decode_scale)).clamp(-6, 6) * unit).double()
    gen = sr_generator(3, 0, DEVICE)
    draws = torch.stack(
        [
            nvfp4.fake_quantize(x, rounding="sr", generator=gen, out_dtype=torch.float32, impl="triton")[0]
            for _ in range(36)
        ]
    ).double()
    err = (draws.mean(0) - expectation).pow(2).mean().sqrt()
    one = (draws[0] - expectation).pow(2).mean().sqrt()
    assert err < one / 4.5  # 1/sqrt(36) = 1/6 of one draw's error, with slack
    # 8-bit SR leans towards zero by < 1/256 of a step: on this symmetric input the signed mean cancels.
    assert abs(float((draws.mean(0) - expectation).mean())) < 5 * float(err) / x.numel() ** 0.5


# ------------------------------------------------------------------------------ MXFP4
@kernel_test
@pytest.mark.parametrize("scale_rule", ["rceil", "floor"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_mxfp4_same_bits_as_the_reference(scale_rule, rounding):
    from nvfp4train.formats import kernels

    inputs = edge_inputs()
    nonfinite = inputs[0].clone()
    nonfinite[2, 40], nonfinite[3, 0] = float("nan"), float("inf")  # one block each goes NaN
    tiny = inputs[0] * 2.0**-130  # E8M0 minimum and FP32 subnormals
    for i, x in enumerate(inputs + [nonfinite, tiny, inputs[1].bfloat16()]):
        bits = random_bits_like(x, sr_generator(i)) if rounding == "sr" else None
        ref = mxfp4.quantize(x, rounding, scale_rule, sr_generator(i), impl="reference")
        codes, scales = kernels.mxfp4.quantize(
            x.to(DEVICE), scale_rule, rounding, dense=False, random_bits=None if bits is None else bits.to(DEVICE)
        )
        assert_same(codes, ref.codes, f"input {i} codes")
        assert_same(scales, ref.scales.view(torch.uint8), f"input {i} scales")
        values = kernels.mxfp4.quantize(
            x.to(DEVICE),
            scale_rule,
            rounding,
            dense=True,
            out_dtype=torch.float32,
            random_bits=None if bits is None else bits.to(DEVICE),
        )
        ref_values, _ = mxfp4.fake_quantize(
            x, rounding, scale_rule, sr_generator(i), out_dtype=torch.float32, impl="reference"
        )
        assert_same(values, ref_values, f"input {i} values")
    if rounding == "rne":  # the public entry points route to the same kernel
        q = mxfp4.quantize(inputs[0].to(DEVICE), scale_rule=scale_rule, impl="triton")
        assert_same(q.codes, mxfp4.quantize(inputs[0], scale_rule=scale_rule, impl="reference").codes, "public")


@kernel_test
def test_mxfp4_golden_vectors():
    manifest, tensors = load_golden()
    for name in golden_subset("mxfp4"):
        q = mxfp4.quantize(tensors[f"{name}/x"].to(DEVICE), scale_rule="rceil", impl="triton")
        assert_same(q.codes, tensors[f"{name}/rowwise_codes"], f"{name} codes")
        assert_same(q.scales.to(torch.float32), tensors[f"{name}/rowwise_scales_fp32"], f"{name} scales")


# ------------------------------------------------------------------------------ FP8 blockwise
@kernel_test
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_blockwise_same_bits_as_the_reference(block, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 256, generator=gen)
    x[::7, ::13] *= 300
    x[5] *= 1e-30  # tiny blocks: the encode scale overflows to the input dtype's max
    x[9, :128] = 0.0
    x[10, :5] = -0.0
    x[60:64] *= 1e-40  # FP32 (and bf16) subnormal inputs
    x[100, 3], x[101, 200] = float("nan"), float("inf")
    for xx, pow2, out_dtype in (
        (x, False, torch.bfloat16),
        (x, True, torch.float32),
        (x.bfloat16(), False, torch.bfloat16),
        (x.half(), True, torch.float32),
    ):
        what = f"{xx.dtype} pow2={pow2}"
        data, scales = fp8.quantize_blockwise(xx.to(DEVICE), block, dtype, pow2, impl="triton")
        want_data, want_scales = fp8.quantize_blockwise(xx, block, dtype, pow2, impl="reference")
        assert_same(data.view(torch.uint8), want_data.view(torch.uint8), f"{what} data")
        assert_same(scales, want_scales, f"{what} scales")
        values, _ = fp8.fake_quantize_blockwise(xx.to(DEVICE), block, dtype, pow2, out_dtype, impl="triton")
        want, _ = fp8.fake_quantize_blockwise(xx, block, dtype, pow2, out_dtype, impl="reference")
        assert_same(values, want, f"{what} values {out_dtype}")
        for out in (torch.float32, torch.bfloat16):  # the emulated GEMM's operand from the raw form
            got = fp8.dequantize_blockwise(data, scales, block, out, impl="triton")
            assert_same(
                got,
                fp8.dequantize_blockwise(want_data, want_scales, block, out, impl="reference"),
                f"{what} dequantized to {out}",
            )


def _block_maxima(dtype: torch.dtype) -> torch.Tensor:
    """Block maxima in every binade of ``dtype`` (FP32 exponents 0..254), at the mantissas where fp8_max / amax
    changes binade (1.75, the FP8 maxima's mantissa, and one ulp of ``dtype`` either side), at 1 and just below
    2; subnormals, 0, Inf and NaN; as FP32 values that ``dtype`` holds exactly."""
    ulp = {torch.float32: 1, torch.bfloat16: 1 << 16, torch.float16: 1 << 13}[dtype]
    mantissas = torch.tensor([0, ulp, 0x600000 - ulp, 0x600000, 0x600000 + ulp, 0x800000 - ulp])
    exponents = torch.arange(0, 255)
    bits = ((exponents[:, None] << 23) | mantissas[None, :]).flatten().to(torch.int32)
    values = torch.cat([bits.view(torch.float32), torch.tensor([0.0, float("inf"), float("nan")])])
    return values[values.to(dtype).float().eq(values) | values.isnan()]


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pow2_scales_of_every_binade(dtype):
    """Power-of-two scales (integer arithmetic on amax's bits in the kernels) against the reference's division
    and frexp, for blocks whose maximum lies in every binade of the input dtype, at the mantissas where the
    quotient's binade changes, subnormal, zero, Inf and NaN; and the codes they give the block's elements."""
    for in_dtype in (torch.float32, torch.bfloat16, torch.float16):
        amax = _block_maxima(in_dtype)
        x = torch.zeros(amax.numel(), 128)
        x[:, 0] = amax
        x[:, 5] = -amax * 0.3
        x[:, 77] = amax * 0.7
        x = x.to(in_dtype)
        what = f"{in_dtype} {len(amax)} blocks"
        data, scales = fp8.quantize_blockwise(x.to(DEVICE), (1, 128), dtype, True, impl="triton")
        want_data, want_scales = fp8.quantize_blockwise(x, (1, 128), dtype, True, impl="reference")
        assert_same(scales, want_scales, f"{what} scales")
        assert_same(data.view(torch.uint8), want_data.view(torch.uint8), f"{what} data")


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_blockwise_t_same_bits_as_quantizing_the_transpose(dtype):
    """The Wgrad operand kernel (x [tokens, features] read as it lies, codes written transposed) against
    quantize_blockwise(x.t().contiguous(), (1, 128)): codes and scales bit for bit, with features that no
    tile divides, zero / tiny / subnormal / NaN / Inf blocks, every input dtype, pow2 or FP32 scales."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(384, 200, generator=gen)
    x[::5, ::11] *= 300
    x[128:256, 7] = 0.0
    x[:128, 9] *= 1e-30
    x[256:, 20:30] *= 1e-40
    x[300, 50], x[10, 199] = float("nan"), float("inf")
    for xx, pow2 in ((x, False), (x, True), (x.bfloat16(), True), (x.half(), False)):
        what = f"{xx.dtype} pow2={pow2}"
        data, scales = fp8.quantize_blockwise_t(xx.to(DEVICE), dtype, pow2, impl="triton")
        want_data, want_scales = fp8.quantize_blockwise(xx.t().contiguous(), (1, 128), dtype, pow2, impl="reference")
        assert data.dtype == dtype and data.shape == (200, 384) and scales.shape == (200, 3)
        assert_same(data.view(torch.uint8), want_data.view(torch.uint8), f"{what} data")
        assert_same(scales, want_scales, f"{what} scales")


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_blockwise_rowcol_same_bits_as_the_two_quantizers(dtype):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(256, 384, generator=gen)
    x[::5, ::11] *= 300
    x[128:256, 7] = 0.0
    x[3, 128:256] = 0.0
    x[:128, 9] *= 1e-30
    x[256 - 64 :, 20:30] *= 1e-40
    x[200, 50], x[10, 300] = float("nan"), float("inf")
    # (x, its row copy's width): features a multiple of 128; ragged (300) with its row copy padded to 384 and
    # to 512 (a tile of padding only), the Wgrad copy unpadded
    cases = [
        (x, False, None),
        (x, True, None),
        (x.bfloat16(), True, None),
        (x.half(), False, None),
        (x[:, :300], False, 384),
        (x[:, :300].bfloat16(), True, 512),
    ]
    for xx, pow2, width in cases:
        what = f"{xx.dtype} pow2={pow2} {tuple(xx.shape)} row_width={width}"
        (rd, rs), (cd, cs) = fp8.quantize_blockwise_rowcol(xx.to(DEVICE), dtype, pow2, row_width=width, impl="triton")
        (wrd, wrs), (wcd, wcs) = fp8.quantize_blockwise_rowcol(xx, dtype, pow2, row_width=width, impl="reference")
        features = xx.shape[1]
        width = width or features
        assert rd.dtype == cd.dtype == dtype and cd.shape == (features, 256) and cs.shape == (features, 2)
        assert rd.shape == (256, width) and rs.shape == (256, width // 128)
        # scales block-major (the layout torch._scaled_mm reads; operands.stored_fp8_scales): views, no copy
        assert rs.t().is_contiguous() and cs.t().is_contiguous(), f"{what}: scales' strides {rs.stride()} {cs.stride()}"
        want_row = fp8.quantize_blockwise(
            torch.nn.functional.pad(xx, (0, width - features)), (1, 128), dtype, pow2, impl="reference"
        )
        assert_same(wrd.view(torch.uint8), want_row[0].view(torch.uint8), f"{what} reference row data")
        assert not wrd[:, features:].view(torch.uint8).any()
        for name, got, want in (
            ("row data", rd, wrd),
            ("row scales", rs, wrs),
            ("col data", cd, wcd),
            ("col scales", cs, wcs),
        ):
            assert_same(
                got.view(torch.uint8) if got.dtype == dtype else got,
                want.view(torch.uint8) if want.dtype == dtype else want,
                f"{what} {name}",
            )


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_tensorwise_same_bits_as_the_reference(dtype):
    """The amax pass + cast kernel against fp8.quantize_tensorwise's PyTorch code: codes and the decode
    scale bit for bit, also for an all-zero tensor (scale 1), a tiny one (the encode scale overflows),
    subnormal inputs, a size that no block divides, and NaN / Inf anywhere (everything NaN)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(96, 200, generator=gen)
    x[::7, ::13] *= 300
    x[60:64] *= 1e-40
    cases = {
        "random": x,
        "odd size": x[:, :77],
        "zeros": torch.zeros(33, 64),
        "tiny": x * 1e-36,
        "subnormal": x * 1e-40,
        "nan": x.clone().index_put_((torch.tensor([3]), torch.tensor([5])), torch.tensor(float("nan"))),
        "inf": x.clone().index_put_((torch.tensor([90]), torch.tensor([199])), torch.tensor(float("inf"))),
    }
    for name, xc in cases.items():
        for xx, pow2 in ((xc, False), (xc, True), (xc.bfloat16(), False), (xc.half(), True)):
            what = f"{name} {xx.dtype} pow2={pow2}"
            data, decode = fp8.quantize_tensorwise(xx.to(DEVICE), dtype, pow2, impl="triton")
            want_data, want_decode = fp8.quantize_tensorwise(xx, dtype, pow2, impl="reference")
            assert data.dtype == dtype and data.shape == xx.shape and decode.shape == ()
            assert_same(data.view(torch.uint8), want_data.view(torch.uint8), f"{what} data")
            assert_same(decode, want_decode, f"{what} decode scale")


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_tensorwise_rowcol_same_bits_as_quantizing_x_and_its_transpose(dtype):
    """One cast writes per-tensor FP8 of x and of x.T: the codes and scale of quantize_tensorwise(x) and
    of quantize_tensorwise(x.t()) bit for bit, for sizes no 64 x 64 tile divides, subnormals, zeros
    and NaN."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(150, 200, generator=gen)
    x[::7, ::13] *= 300
    x[60:64] *= 1e-40
    x_nan = x.clone()
    x_nan[70, 150] = float("nan")
    for name, xc in {"random": x, "odd": x[:77, :130], "zeros": torch.zeros(33, 64), "nan": x_nan}.items():
        for xx in (xc, xc.bfloat16(), xc.half()):
            what = f"{name} {xx.dtype}"
            (data, decode), (data_t, decode_t) = fp8.quantize_tensorwise_rowcol(xx.to(DEVICE), dtype, impl="triton")
            want, want_decode = fp8.quantize_tensorwise(xx, dtype, impl="reference")
            want_t, want_decode_t = fp8.quantize_tensorwise(xx.t().contiguous(), dtype, impl="reference")
            assert data.dtype == data_t.dtype == dtype and data_t.shape == xx.t().shape and data_t.is_contiguous()
            assert_same(data.view(torch.uint8), want.view(torch.uint8), f"{what} data")
            assert_same(data_t.view(torch.uint8), want_t.view(torch.uint8), f"{what} transposed data")
            assert_same(decode, want_decode, f"{what} decode")
            assert_same(decode_t, want_decode_t, f"{what} transposed decode")
    (data, _), (data_t, _) = fp8.quantize_tensorwise_rowcol(x, dtype, impl="reference")
    assert torch.equal(data_t.view(torch.uint8), data.view(torch.uint8).t())


def prologue_cases():
    """(pre-activation a, gradient dh) bf16 pairs for the squared-ReLU prologue: signs, zeros of both signs, values
    whose square overflows bf16 or underflows, NaN and Inf in a or in dh; [256, 384] and ragged [256, 300]."""
    gen = torch.Generator().manual_seed(9)
    a = torch.randn(256, 384, generator=gen) * torch.rand(256, 1, generator=gen) * 4
    a[::7, ::13] *= 1e3
    a[5, :6] = torch.tensor([0.0, -0.0, 2e19, 1e-25, -3e19, 1e-40])
    dh = torch.randn(256, 384, generator=gen) * 1e-3
    dh[9, :3] = torch.tensor([1e38, -0.0, 1e-38])
    a_nan, dh_inf = a.clone(), dh.clone()
    a_nan[130, 200] = float("nan")
    dh_inf[40, 10] = float("inf")
    return {
        "random": (a, dh),
        "ragged": (a[:, :300], dh[:, :300]),
        "nan in a": (a_nan, dh),
        "inf in dh": (a, dh_inf),
    }


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_rowcol_prologue_same_bits_as_quantizing_the_activation(dtype):
    """Blockwise and per-tensor rowcol with a squared-ReLU prologue (forward: relu(a)²; backward: its gradient
    from dh and a) give the codes and scales of quantizing the activation that formats.activation writes out."""
    from nvfp4train.formats import activation

    for name, (a32, dh32) in prologue_cases().items():
        a, dh = a32.bfloat16(), dh32.bfloat16()
        width = 384
        for prologue, x, act_input in (("squared_relu", a, None), ("squared_relu_grad", dh, a)):
            want_x = activation.apply(prologue, x, act_input)
            what = f"{name} {prologue}"
            dev_input = None if act_input is None else act_input.to(DEVICE)
            got = fp8.quantize_blockwise_rowcol(
                x.to(DEVICE), dtype, True, row_width=width, prologue=prologue, act_input=dev_input, impl="triton"
            )
            want = fp8.quantize_blockwise_rowcol(want_x, dtype, True, row_width=width, impl="reference")
            ref = fp8.quantize_blockwise_rowcol(
                x, dtype, True, row_width=width, prologue=prologue, act_input=act_input, impl="reference"
            )
            for g, w, r, part in zip(sum(got, ()), sum(want, ()), sum(ref, ()), ("rd", "rs", "cd", "cs")):
                assert_same(g, w, f"blockwise {what} {part}")
                assert_same(r, w, f"blockwise reference {what} {part}")
            got = fp8.quantize_tensorwise_rowcol(
                x.to(DEVICE), dtype, prologue=prologue, act_input=dev_input, impl="triton"
            )
            want = fp8.quantize_tensorwise_rowcol(want_x, dtype, impl="reference")
            for g, w, part in zip(sum(got, ()), sum(want, ()), ("data", "decode", "data_t", "decode_t")):
                assert_same(g, w, f"tensorwise {what} {part}")
    with pytest.raises(ValueError, match="act_input must be given"):
        fp8.quantize_blockwise_rowcol(a, dtype, prologue="squared_relu_grad", impl="reference")
    with pytest.raises(ValueError, match="prologue='gelu' is not supported"):
        fp8.quantize_tensorwise_rowcol(a, dtype, prologue="gelu", impl="reference")


@kernel_test
def test_gemm_epilogue_scale_and_cast_same_bits_as_eager():
    """The emulated GEMM's epilogue in one pass: ((out * a) * b).to(dtype) as eager rounds it (each
    product in FP32, then the cast), with either factor absent, for overflow, subnormals and NaN."""
    from nvfp4train.formats import kernels
    from nvfp4train.precision.backends import scale_and_cast

    gen = torch.Generator().manual_seed(3)
    out = torch.randn(70, 130, generator=gen) * 1e3
    out[0, :4] = torch.tensor([3.0e38, -1e-42, float("nan"), float("inf")])
    a, b = torch.tensor(0.01234567, dtype=torch.float32), torch.tensor(3.3e-3, dtype=torch.float32)
    for fa, fb in ((a, b), (a, None), (None, b), (None, None)):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            want = scale_and_cast(out, fa, fb, dtype)  # CPU: eager
            got = kernels.dequant.scale_and_cast(
                out.to(DEVICE), None if fa is None else fa.to(DEVICE), None if fb is None else fb.to(DEVICE), dtype
            )
            assert_same(got, want, f"a={fa is not None} b={fb is not None} {dtype}")


@kernel_test
def test_nvfp4_and_mxfp4_dequantize_same_bits_as_the_reference():
    """Packed codes and scales -> values in one pass: every code byte and every scale bit pattern (NaN
    scales, E8M0's 2^-127 and NaN included), with and without NVFP4's global scale, FP32, BF16 and FP16
    out, also for a shape the kernel's 8 x 256 tiles do not divide."""
    gen = torch.Generator().manual_seed(4)
    for rows, cols in ((48, 256), (45, 96)):
        codes = torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.uint8)
        codes.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)  # every byte value appears
        e4m3 = torch.randint(0, 256, (rows, cols // 16), generator=gen, dtype=torch.uint8)
        e4m3.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
        e8m0 = torch.randint(0, 256, (rows, cols // 32), generator=gen, dtype=torch.uint8)
        n = min(256, e8m0.numel())  # every E8M0 value, or an even spread with 0 (2^-127) and 255 (NaN)
        e8m0.view(-1)[:n] = torch.arange(256, dtype=torch.uint8)[torch.arange(n) * 255 // (n - 1)]
        amax, s_dec = torch.tensor(3.0), torch.tensor(0.0123456789)
        nv = nvfp4.NVFP4Tensor(codes, e4m3.view(torch.float8_e4m3fn), amax, s_dec, torch.Size((rows, cols)), (1, 16))
        mx = mxfp4.MXFP4Tensor(codes, e8m0.view(torch.float8_e8m0fnu), torch.Size((rows, cols)), "rceil")
        nv_dev = nvfp4.NVFP4Tensor(
            codes.to(DEVICE),
            e4m3.view(torch.float8_e4m3fn).to(DEVICE),
            amax.to(DEVICE),
            s_dec.to(DEVICE),
            nv.shape,
            (1, 16),
        )
        mx_dev = mxfp4.MXFP4Tensor(codes.to(DEVICE), e8m0.view(torch.float8_e8m0fnu).to(DEVICE), mx.shape, "rceil")
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            what = f"{rows}x{cols} {dtype}"
            for apply_global in (False, True):
                assert_same(
                    nv_dev.dequantize(dtype, apply_global, impl="triton"),
                    nv.dequantize(dtype, apply_global, impl="reference"),
                    f"nvfp4 {what} global={apply_global}",
                )
            assert_same(
                mx_dev.dequantize(dtype, impl="triton"), mx.dequantize(dtype, impl="reference"), f"mxfp4 {what}"
            )


# ------------------------------------------------------------------------------ RHT along the last dimension
@kernel_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rht_rows_same_bits_as_the_reference_loop(dtype):
    """hadamard.rht on the kernel (Fprop and Dgrad operands of a recipe with the RHT there): the reference
    loop's bits, for d 16 and 32, ragged row and block counts (masked programs), default and seeded signs."""
    gen = torch.Generator().manual_seed(11)
    for shape, d in (((37, 48), 16), ((3, 5, 96), 32), ((20, 16), 16), ((1, 288), 16), ((17, 160), 32)):
        x = torch.randn(*shape, generator=gen)
        x[..., ::7] *= 300
        x[0, ..., :d] = 0.0  # a zero block
        if dtype != torch.float16:  # magnitudes over 2^-20..2^20: the FP32 sums round; FP32 subnormal products
            x = x * torch.exp2(torch.randint(-20, 20, x.shape, generator=gen).float())
            x.view(-1)[3] = 1e-40 if dtype == torch.float32 else x.view(-1)[3]
            x.view(-1)[-5] = float("nan")
        x = x.to(dtype)
        for signs in (None, 3):
            got = hadamard.rht(x.to(DEVICE), d, signs, impl="triton")
            want = hadamard.rht(x, d, signs, impl="reference")
            assert got.dtype == dtype and got.shape == x.shape
            assert_same(got, want, f"{tuple(shape)} d={d} signs={signs}")


# ------------------------------------------------------------------------------ Wgrad: RHT + transpose
@kernel_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rht_quantize_t_same_bits_as_rht_then_quantize(dtype):
    from nvfp4train.formats import kernels

    gen = torch.Generator().manual_seed(1)
    for n_tokens, n_features in ((64, 48), (32, 80)):  # 4 groups of 16 tokens per program, and the 1-group fallback
        x = torch.randn(n_tokens, n_features, generator=gen)
        x[::7, ::5] *= 300
        x[3] *= 2.0**-12
        x[16:32, 7] = 0.0  # a zero block of the output
        # Magnitudes spread over 2^-20..2^20: the FP32 sums round (hadamard.rht's definition).
        x[:, 40:] *= torch.exp2(torch.randint(-20, 20, (n_tokens, n_features - 40), generator=gen).float())
        x = x.to(dtype)
        q = nvfp4.rht_quantize_t(x.to(DEVICE), impl="triton")
        want = nvfp4.quantize(hadamard.rht(x.t(), 16), (1, 16), impl="reference")
        assert q.shape == want.shape == (n_features, n_tokens)
        for name in ("codes", "scales", "amax", "global_decode_scale"):
            got, ref = getattr(q, name), getattr(want, name)
            if name == "scales":
                got, ref = got.view(torch.uint8), ref.view(torch.uint8)
            assert_same(got, ref, f"{tuple(x.shape)} {name}")
        values, s_dec = nvfp4.rht_fake_quantize_t(x.to(DEVICE), out_dtype=torch.float32, impl="triton")
        assert_same(values, want.dequantize(apply_global_scale=False), f"{tuple(x.shape)} values")
        # SR with the reference's bits (drawn in the [features, tokens] layout), and other signs.
        signs = hadamard.random_signs(16, 5)
        bits = random_bits_like(torch.empty(n_features, n_tokens), sr_generator(2))
        got = kernels.rht.nvfp4_t(x.to(DEVICE), signs, "sr", dense=False, random_bits=bits.to(DEVICE))
        want = nvfp4.rht_quantize_t(x, "sr", sr_generator(2), signs, impl="reference")
        assert_same(got[0], want.codes, "sr codes")
        assert_same(got[1], want.scales.view(torch.uint8), "sr scales")


@kernel_test
def test_rht_quantize_t_philox_sr_matches_its_dense_twin_and_non_finite_policy():
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    q = nvfp4.rht_quantize_t(x, "sr", sr_generator(8, 0, DEVICE), impl="triton")
    values, _ = nvfp4.rht_fake_quantize_t(x, "sr", sr_generator(8, 0, DEVICE), out_dtype=torch.float32, impl="triton")
    assert_same(values, q.dequantize(apply_global_scale=False).cpu(), "fake vs quantize")
    x[5, 3] = float("nan")
    q = nvfp4.rht_quantize_t(x, impl="triton")
    assert (q.scales.view(torch.uint8).cpu() == 0x7F).all() and q.global_decode_scale.isnan()


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_rht_quantize_t_same_bits_as_rht_then_quantize(dtype):
    from nvfp4train.formats import kernels

    gen = torch.Generator().manual_seed(7)
    # 64 tokens: the default 4 groups of 32 per program halved to 2; 96 tokens, blocks=(4, 32): halved to 1 group
    # (3 of 32 tokens), 32 features per program (40: the last program masks 24).
    for (n_tokens, n_features), blocks in (((64, 48), None), ((96, 40), (4, 32)), ((64, 48), (2, 64, 8))):
        x = torch.randn(n_tokens, n_features, generator=gen)
        x[::7, ::5] *= 300
        x[3] *= 2.0**-12
        x[32:64, 7] = 0.0  # a zero block of the output: scale 2^-127
        # Magnitudes spread over 2^-20..2^20: the FP32 products and sums round (hadamard.rht's definition).
        x[:, 24:] *= torch.exp2(torch.randint(-20, 20, (n_tokens, n_features - 24), generator=gen).float())
        x = x.to(dtype)
        for scale_rule in ("rceil", "floor"):
            what = f"{tuple(x.shape)} {scale_rule}"
            q = mxfp4.rht_quantize_t(x.to(DEVICE), scale_rule=scale_rule, impl="triton", blocks=blocks)
            want = mxfp4.quantize(hadamard.rht(x.t().contiguous(), 32), scale_rule=scale_rule, impl="reference")
            assert q.shape == want.shape == (n_features, n_tokens) and q.scale_rule == want.scale_rule
            assert_same(q.codes, want.codes, f"{what} codes")
            assert_same(q.scales.view(torch.uint8), want.scales.view(torch.uint8), f"{what} scales")
            values, one = mxfp4.rht_fake_quantize_t(
                x.to(DEVICE), scale_rule=scale_rule, out_dtype=torch.float32, impl="triton", blocks=blocks
            )
            assert_same(values, want.dequantize(), f"{what} values")
            assert float(one) == 1.0
        # SR with the reference's bits (drawn in the [features, tokens] layout), and other signs.
        signs = hadamard.random_signs(32, 5)
        bits = random_bits_like(torch.empty(n_features, n_tokens), sr_generator(2))
        got = kernels.rht.mxfp4_t(
            x.to(DEVICE), signs, "rceil", "sr", dense=False, random_bits=bits.to(DEVICE), blocks=blocks
        )
        want = mxfp4.rht_quantize_t(x, "sr", sr_generator(2), signs, impl="reference")
        assert_same(got[0], want.codes, "sr codes")
        assert_same(got[1], want.scales.view(torch.uint8), "sr scales")
        values = kernels.rht.mxfp4_t(
            x.to(DEVICE),
            signs,
            "rceil",
            "sr",
            dense=True,
            random_bits=bits.to(DEVICE),
            out_dtype=torch.float32,
            blocks=blocks,
        )
        assert_same(values, want.dequantize(), "sr values")


@kernel_test
def test_mxfp4_rht_quantize_t_philox_sr_and_non_finite_blocks():
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    # Philox SR: the bits the plain MXFP4 kernel draws from the same seed for the materialized operand.
    q = mxfp4.rht_quantize_t(x, "sr", sr_generator(8, 0, DEVICE), impl="triton")
    plain = mxfp4.quantize(
        hadamard.rht(x.t().contiguous(), 32), "sr", generator=sr_generator(8, 0, DEVICE), impl="triton"
    )
    assert_same(q.codes, plain.codes.cpu(), "philox codes")
    values, _ = mxfp4.rht_fake_quantize_t(x, "sr", sr_generator(8, 0, DEVICE), out_dtype=torch.float32, impl="triton")
    assert_same(values, q.dequantize().cpu(), "fake vs quantize")
    # A NaN spreads over its 32-token block of the transform: that block's scale is NaN, no other.
    x[5, 3] = float("nan")
    scales = mxfp4.rht_quantize_t(x, impl="triton").scales.view(torch.uint8).cpu()
    assert scales[3, 0] == mxfp4.E8M0_NAN and int((scales == mxfp4.E8M0_NAN).sum()) == 1


def test_rht_blocks_are_powers_of_two_and_groups_divide_the_tokens():
    pytest.importorskip("triton")
    from nvfp4train.formats import kernels

    default = (kernels.rht.RHT_GROUPS, kernels.rht.RHT_BLOCK_F)
    assert kernels.rht.program_blocks(256, 32) == (*default, default[0] * default[1] // 64)  # a warp per 64 pairs
    assert kernels.rht.program_blocks(96, 32, (8, 128)) == (1, 128, 2)  # 3 groups of 32: halved down to 1
    assert kernels.rht.program_blocks(192, 16, (8, 32)) == (4, 32, 2)
    assert kernels.rht.program_blocks(192, 16, (8, 32, 8)) == (4, 32, 8)  # warps as given
    assert kernels.rht.program_blocks(16, 16, (1, 16)) == (1, 16, 1)  # at least one warp
    for bad in ((3, 64), (4, 64, 3), (4, 64, 8, 1)):
        with pytest.raises(ValueError, match="rht blocks"):
            kernels.rht.program_blocks(256, 32, bad)


@pytest.mark.slow  # ~25 s with an empty Triton cache
@pytest.mark.skipif(INTERPRETING, reason="compiles for the GPU")
def test_kernels_compile_for_sm90_without_approximate_division():
    """Every kernel variant compiles for an H100 (sm_90; no GPU needed) and its PTX divides only
    with div.rn (no div.full / div.approx, which would change the scales) and fuses multiply-adds only
    where the products are exact. Catches GPU-only front-end errors in CI without a GPU."""
    pytest.importorskip("triton")
    from nvfp4train.formats import kernels
    from nvfp4train.formats.kernels.sm90 import DEQUANTIZE_ARGS as dequantize_args
    from nvfp4train.formats.kernels.sm90 import FP8_BLOCKWISE_ROWCOL_ARGS as fp8_rowcol_args
    from nvfp4train.formats.kernels.sm90 import FP8_TENSORWISE_ROWCOL_ARGS as fp8_tensorwise_rowcol_args
    from nvfp4train.formats.kernels.sm90 import IO_ARGS as common
    from nvfp4train.formats.kernels.sm90 import NVFP4_ARGS as nvfp4_args
    from nvfp4train.formats.kernels.sm90 import RHT_AMAX_ARGS as rht_amax_args
    from nvfp4train.formats.kernels.sm90 import RHT_ARGS as rht_args
    from nvfp4train.formats.kernels.sm90 import RHT_BLOCKS as rht_blocks
    from nvfp4train.formats.kernels.sm90 import SCALE_CAST_ARGS as scale_cast_args
    from nvfp4train.formats.kernels.sm90 import compile_sm90

    blocks = {"BLOCK_R": kernels.common.BLOCK_ROWS, "BLOCK_C": kernels.common.BLOCK_COLS}
    # Each code path once (compiling takes ~1-2 s a variant).
    variants = [
        (
            kernels.amax._abs_max_kernel,
            {"x_ptr": "*bf16", "a_ptr": "*bf16", "partial_ptr": "*i32", "n": "i32"},
            {"BLOCK": kernels.amax.AMAX_BLOCK},
        ),
        (
            kernels.amax._abs_max_kernel,
            {"x_ptr": "*bf16", "a_ptr": "*bf16", "partial_ptr": "*i32", "n": "i32"},
            {"BLOCK": kernels.amax.AMAX_BLOCK, "PROLOGUE": 2, "HW_BF16": True},
        ),
        (
            kernels.nvfp4._nvfp4_kernel,
            nvfp4_args,
            {"TILE_ROWS": 16, "ROUNDING": kernels.rounding.RNE, "DENSE": False, **blocks},
        ),
        (
            kernels.nvfp4._nvfp4_kernel,
            nvfp4_args,
            {"TILE_ROWS": 1, "ROUNDING": kernels.rounding.SR_BITS, "DENSE": True, **blocks},
        ),
        (
            kernels.nvfp4._nvfp4_kernel,
            nvfp4_args,
            {"TILE_ROWS": 1, "ROUNDING": kernels.rounding.SR_PHILOX, "DENSE": False, **blocks},
        ),
        (
            kernels.mxfp4._mxfp4_kernel,
            {**common, "rows": "i32", "cols": "i32"},
            {"SCALE_RULE": 0, "ROUNDING": kernels.rounding.SR_PHILOX, "DENSE": True, **blocks},
        ),
        (
            kernels.mxfp4._mxfp4_kernel,
            {**common, "rows": "i32", "cols": "i32"},
            {"SCALE_RULE": 1, "ROUNDING": kernels.rounding.RNE, "DENSE": False, **blocks},
        ),
        (
            kernels.fp8._fp8_blockwise_kernel,
            {
                "x_ptr": "*bf16",
                "data_ptr": "*u8",
                "scales_ptr": "*fp32",
                "values_ptr": "*u8",
                "rows": "i32",
                "cols": "i32",
                "scale_for_inf": "fp32",
            },
            {
                "TILE_R": 128,
                "FP8_MAX": 448.0,
                "MANT": 3,
                "BIAS": 7,
                "POW2": True,
                "HW_CVT": True,
                "DENSE": False,
                "BLOCK_R": 128,
                "BLOCK_C": 128,
            },
        ),
        (
            kernels.fp8._fp8_blockwise_kernel,
            {
                "x_ptr": "*fp32",
                "data_ptr": "*bf16",
                "scales_ptr": "*bf16",
                "values_ptr": "*bf16",
                "rows": "i32",
                "cols": "i32",
                "scale_for_inf": "fp32",
            },
            {
                "TILE_R": 1,
                "FP8_MAX": 57344.0,
                "MANT": 2,
                "BIAS": 15,
                "POW2": False,
                "HW_CVT": False,
                "DENSE": True,
                "BLOCK_R": 8,
                "BLOCK_C": 256,
            },
        ),
        (
            kernels.fp8._fp8_tensorwise_kernel,
            {"x_ptr": "*bf16", "amax_ptr": "*fp32", "data_ptr": "*u8", "decode_ptr": "*fp32", "n": "i32"},
            {
                "FP8_MAX": 448.0,
                "MANT": 3,
                "BIAS": 7,
                "POW2": False,
                "HW_CVT": True,
                "BLOCK": kernels.fp8.TENSORWISE_BLOCK,
            },
        ),
        (
            kernels.fp8._fp8_tensorwise_rowcol_kernel,
            fp8_tensorwise_rowcol_args,
            {
                "FP8_MAX": 57344.0,
                "MANT": 2,
                "BIAS": 15,
                "POW2": False,
                "HW_CVT": True,
                "BLOCK": kernels.fp8.TENSORWISE_TILE,
            },
        ),
        (
            kernels.dequant._scale_and_cast_kernel,
            scale_cast_args,
            {"HAS_A": True, "HAS_B": True, "BLOCK": kernels.dequant.SCALE_CAST_BLOCK},
        ),
        (
            kernels.dequant._e2m1_dequantize_kernel,
            dequantize_args,
            {"GROUP": 16, "E8M0": False, "HAS_GLOBAL": True, "BLOCK_R": 8, "BLOCK_C": 256},
        ),
        (
            kernels.dequant._e2m1_dequantize_kernel,
            {**dequantize_args, "values_ptr": "*fp32"},
            {"GROUP": 32, "E8M0": True, "HAS_GLOBAL": False, "BLOCK_R": 8, "BLOCK_C": 256},
        ),
        (
            kernels.fp8._fp8_blockwise_rowcol_kernel,
            fp8_rowcol_args,
            {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": True, "HW_CVT": True, "RAGGED": True},
        ),
        (
            kernels.fp8._fp8_blockwise_rowcol_kernel,
            fp8_rowcol_args,
            {
                "FP8_MAX": 448.0,
                "MANT": 3,
                "BIAS": 7,
                "POW2": True,
                "HW_CVT": True,
                "RAGGED": False,
                "PROLOGUE": 1,
                "HW_BF16": True,
            },
        ),
        (
            kernels.fp8._fp8_blockwise_rowcol_kernel,
            fp8_rowcol_args,
            {
                "FP8_MAX": 57344.0,
                "MANT": 2,
                "BIAS": 15,
                "POW2": True,
                "HW_CVT": True,
                "RAGGED": True,
                "PROLOGUE": 2,
                "HW_BF16": False,
            },
        ),
        (
            kernels.fp8._fp8_blockwise_t_kernel,
            {
                "x_ptr": "*bf16",
                "data_ptr": "*u8",
                "scales_ptr": "*fp32",
                "n_tokens": "i32",
                "n_features": "i32",
                "scale_for_inf": "fp32",
            },
            {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": True, "HW_CVT": False, "BLOCK_T": 128, "BLOCK_F": 64},
        ),
        (
            kernels.dequant._fp8_dequantize_blockwise_kernel,
            {"data_ptr": "*u8", "scales_ptr": "*fp32", "values_ptr": "*bf16", "rows": "i32", "cols": "i32"},
            {"TILE_R": 128, "MANT": 3, "BIAS": 7, "BLOCK_R": 8, "BLOCK_C": 256},
        ),
        (
            kernels.rht._rht_abs_max_kernel,
            rht_amax_args,
            {"ROWWISE": True, **rht_blocks},
        ),
        (
            kernels.rht._rht_abs_max_kernel,
            {**rht_amax_args, "x_ptr": "*fp32"},
            {"ROWWISE": False, **rht_blocks},
        ),
        (
            kernels.rht._rht_nvfp4_kernel,
            rht_args,
            {
                "ROUNDING": kernels.rounding.RNE,
                "DENSE": False,
                "ROWWISE": False,
                "ROW_DENSE": False,
                "HW_BF16": False,
                **rht_blocks,
            },
        ),
        (
            kernels.rht._rht_nvfp4_kernel,
            rht_args,
            {
                "ROUNDING": kernels.rounding.SR_PHILOX,
                "DENSE": True,
                "ROWWISE": True,
                "ROW_DENSE": False,
                "HW_BF16": True,
                **rht_blocks,
            },
        ),
        # rht_blocks' warps: the same tile on 8 warps (a (group, feature) column a thread)
        (
            kernels.rht._rht_nvfp4_kernel,
            rht_args,
            {
                "ROUNDING": kernels.rounding.SR_PHILOX,
                "DENSE": True,
                "ROWWISE": False,
                "ROW_DENSE": False,
                "HW_BF16": True,
                **rht_blocks,
            },
            {"num_warps": 8},
        ),
        (
            kernels.rht._rht_mxfp4_kernel,
            {**common, "n_tokens": "i32", "n_features": "i32"},
            {
                **rht_blocks,
                "SIGN_MASK": 0xB7E8C3A1,
                "SCALE_RULE": 0,
                "ROUNDING": kernels.rounding.RNE,
                "DENSE": False,
                "HW_BF16": True,
            },
        ),
        (
            kernels.rht._rht_mxfp4_kernel,
            {**common, "n_tokens": "i32", "n_features": "i32"},
            {
                **rht_blocks,
                "SIGN_MASK": 0xB7E8C3A1,
                "SCALE_RULE": 1,
                "ROUNDING": kernels.rounding.SR_PHILOX,
                "DENSE": True,
                "HW_BF16": False,
            },
        ),
    ]
    for kernel, signature, constexprs, *options in variants:
        compiled = compile_sm90(kernel, signature, constexprs, **dict(*options))
        ptx = compiled.asm["ptx"]
        assert "div.full" not in ptx and "div.approx" not in ptx, (kernel, constexprs)
        # FP8 codes from the GPU's own RNE conversion of FP32 (never through FP16: a second rounding)
        if "HW_CVT" in constexprs:
            fmt = "e4m3x2" if constexprs["MANT"] == 3 else "e5m2x2"
            assert (f"cvt.rn.satfinite.{fmt}.f32" in ptx) == constexprs["HW_CVT"], (kernel, constexprs)
            assert ".f16x2" not in ptx, (kernel, constexprs)
        # The RHT's bf16 rounding by the GPU's RNE conversion where asked (HW_BF16), else bit arithmetic.
        if "HW_BF16" in constexprs:
            # (two at a time, cvt.rn.bf16x2.f32, where the compiler pairs them)
            assert bool(re.search(r"cvt\.rn\.bf16(x2)?\.f32", ptx)) == constexprs["HW_BF16"], (kernel, constexprs)
        # Fused multiply-adds only where the products are exact: the 16-point RHT of a bf16 input
        # (_rht_tokens' EXACT_PRODUCTS: x * +-1/4), never on FP32 inputs nor in the 32-point RHT, whose
        # products round; and e2m1.round_e2m1's offset times +-2 (SR) or +-2^22 (RNE), a power of two.
        exact_products = (
            kernel in (kernels.rht._rht_abs_max_kernel, kernels.rht._rht_nvfp4_kernel) and signature["x_ptr"] == "*bf16"
        )
        rht_entries = {"0f3E800000", "0fBE800000"}
        offset_multipliers = {"0f40000000", "0fC0000000", "0f4A800000", "0fCA800000"}
        multipliers = re.findall(r"fma\.rn\.f32\s+[^,]+,\s*[^,]+,\s*([^,]+),", ptx)
        assert set(multipliers) <= rht_entries | offset_multipliers, (kernel, constexprs, set(multipliers))
        assert bool(set(multipliers) & rht_entries) == exact_products, (kernel, signature["x_ptr"], constexprs)
        if kernel in (kernels.rht._rht_abs_max_kernel, kernels.rht._rht_nvfp4_kernel, kernels.rht._rht_mxfp4_kernel):
            # The transform stays in each thread's registers: shared memory re-lays out at most the
            # stored tiles (codes and scales), not every loaded token row (16 re-layouts a program
            # before), plus the packed codes' NaN mask (e2m1.masked_codes: the pairs' reduced layout
            # back to the tile's, the same registers); the rowwise copy's 2-D tile adds its own (its
            # stores, and its Philox bytes: a call serves 16 consecutive elements, which span two
            # threads of that tile, so its words and bytes are interleaved across threads).
            relayouts = compiled.asm["ttgir"].count("ttg.convert_layout")
            assert relayouts <= (9 if constexprs.get("ROWWISE") else 3), (kernel, constexprs, relayouts)


# ------------------------------------------------------------------------------ operands' routing
def wgrad_route_cases():
    from nvfp4train.precision.recipe import OperandSpec

    x2d = torch.randn(64, 48, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)  # [tokens, in]
    return x2d, [
        spec
        for rounding in ("rne", "sr")
        for spec in (
            OperandSpec("nvfp4", (1, 16), rounding, rht_dim=16),
            OperandSpec("mxfp4", (1, 32), rounding, 32, "rceil"),
        )
    ]


def check_wgrad_route(x2d, spec, device):
    """operands.pack / fake_quantize of the layer's x2d.t() (fused entry) against the generic path
    (a contiguous copy, which prepare pads, transforms and quantizes): the same numbers."""
    from nvfp4train.precision import operands

    xt = x2d.to(device).t()
    assert operands._fused_wgrad_rht(xt, spec, 64) and not operands._fused_wgrad_rht(xt.contiguous(), spec, 64)
    fused = operands.pack(xt, spec, 64, sr_generator(1, 0, device))
    generic = operands.pack(xt.contiguous(), spec, 64, sr_generator(1, 0, device))
    assert fused.layout == generic.layout
    # SR included: both routes draw the same way (the Triton kernels' Philox word depends on the
    # element's output index only, so the RHT kernel and the plain one agree).
    for a, b in zip(fused.tensors, generic.tensors):
        scale_dtypes = (torch.float8_e4m3fn, torch.float8_e8m0fnu)
        as_bytes = lambda t: t.view(torch.uint8) if t.dtype in scale_dtypes else t  # noqa: E731
        assert_same(as_bytes(a), as_bytes(b).cpu(), spec)
    dense = operands.fake_quantize(xt, spec, 64, sr_generator(1, 0, device))
    assert_same(dense.values, fused.dequantize().values.cpu(), spec)
    assert (dense.decode_scale is None) == (fused.dequantize().decode_scale is None) == (spec.format == "mxfp4")


def test_operands_route_the_wgrad_operand_through_the_fused_entry():
    x2d, specs = wgrad_route_cases()
    for spec in specs:  # CPU, impl="auto": the reference behind both routes
        check_wgrad_route(x2d, spec, torch.device("cpu"))


@kernel_test
def test_operands_wgrad_route_runs_the_kernel(monkeypatch):
    from nvfp4train.precision import operands

    monkeypatch.setattr(operands, "QUANT_IMPL", "triton")
    x2d, specs = wgrad_route_cases()
    for spec in specs:
        check_wgrad_route(x2d, spec, DEVICE)


@kernel_test
@pytest.mark.parametrize("preset", ["nvfp4", "mxfp4"])
def test_quant_linear_grads_equal_with_and_without_the_fused_wgrad_entry(monkeypatch, preset):
    """A QuantLinear step with every operand quantized by the Triton kernels: the fused Wgrad entry
    (RHT + transpose + quantize in one kernel) gives the unfused path's output and gradients (x.T
    materialized, hadamard.rht, the plain quantizer) bit for bit, SR on the gradients included."""
    from nvfp4train.precision import operands
    from tests.precision.helpers import inputs, load_preset, make_layer, run

    monkeypatch.setattr(operands, "QUANT_IMPL", "triton")
    policy = load_preset(preset, bf16_first=0, bf16_last=0)
    x, grad = inputs(tokens=64, in_f=64, out_f=48)
    is_fused = operands._fused_wgrad_rht
    routed = []

    def spy(x, spec, k_pad):
        routed.append(is_fused(x, spec, k_pad))
        return routed[-1]

    monkeypatch.setattr(operands, "_fused_wgrad_rht", spy)
    fused = run(make_layer(policy).to(DEVICE), x.to(DEVICE), grad.to(DEVICE))
    assert sum(routed) == 2  # Wgrad's X (packed in the forward) and dY (in the backward)
    monkeypatch.setattr(operands, "_fused_wgrad_rht", lambda x, spec, k_pad: False)
    unfused = run(make_layer(policy).to(DEVICE), x.to(DEVICE), grad.to(DEVICE))
    for name, a, b in zip(("y", "dx", "dw"), fused, unfused):
        assert_same(a, b.cpu(), f"{preset} {name}")


@kernel_test
def test_quant_linear_nvfp4_fprop_and_wgrad_x_from_one_read(monkeypatch):
    """The paper's recipe quantizes X twice in the forward (1x16 for Fprop; RHT + 1x16 along tokens for
    Wgrad): one kernel reads X once for both; the layer's output and gradients are those of the two
    separate quantizations bit for bit."""
    from nvfp4train.precision import operands, pairs
    from tests.precision.helpers import inputs, load_preset, make_layer, run

    monkeypatch.setattr(operands, "QUANT_IMPL", "triton")
    policy = load_preset("nvfp4", bf16_first=0, bf16_last=0)
    x, grad = inputs(tokens=64, in_f=64, out_f=48)
    real = pairs.fprop_and_wgrad_x
    used = []
    monkeypatch.setattr(pairs, "fprop_and_wgrad_x", lambda *a: used.append(real(*a)) or used[-1])
    one_read = run(make_layer(policy).to(DEVICE), x.to(DEVICE), grad.to(DEVICE))
    assert len(used) == 1 and used[0] is not None
    monkeypatch.setattr(pairs, "fprop_and_wgrad_x", lambda *a: None)
    separate = run(make_layer(policy).to(DEVICE), x.to(DEVICE), grad.to(DEVICE))
    for name, a, b in zip(("y", "dx", "dw"), one_read, separate):
        assert_same(a, b.cpu(), f"nvfp4 {name}")


@kernel_test
@pytest.mark.parametrize("preset", ["nvfp4", "nvfp4_no_sr"])
def test_quant_linear_nvfp4_dgrad_and_wgrad_dy_from_one_read(monkeypatch, preset):
    """The backward's two dY operands (1x16 SR for Dgrad; RHT + 1x16 SR along tokens for Wgrad) from one
    read of dY: the layer's gradients, and the SR streams' states afterwards, are those of the two
    separate quantizations bit for bit (each copy's Philox seed comes from its own role's stream)."""
    from nvfp4train.precision import operands, pairs
    from tests.precision.helpers import inputs, load_preset, make_layer, run

    monkeypatch.setattr(operands, "QUANT_IMPL", "triton")
    policy = load_preset(preset, bf16_first=0, bf16_last=0)
    x, grad = inputs(tokens=64, in_f=64, out_f=48)
    real = pairs.dgrad_and_wgrad_dy
    used = []
    results, states = [], []
    for route in ("one read", "separate"):
        monkeypatch.setattr(
            pairs,
            "dgrad_and_wgrad_dy",
            (lambda *a: used.append(real(*a)) or used[-1]) if route == "one read" else (lambda *a: None),
        )
        layer = make_layer(policy).to(DEVICE)
        results.append(run(layer, x.to(DEVICE), grad.to(DEVICE)))
        states.append({role: state.clone() for role, state in layer.sr.state().items()})
    assert len(used) == 1 and used[0] is not None
    for name, a, b in zip(("y", "dx", "dw"), *results):
        assert_same(a, b.cpu(), f"{preset} {name}")
    assert sorted(states[0]) == sorted(states[1]) == (["dgrad_dy", "wgrad_dy"] if preset == "nvfp4" else [])
    for role in states[0]:
        assert torch.equal(states[0][role], states[1][role]), role


@kernel_test
def test_quant_linear_fp8_blockwise_operands_from_one_read(monkeypatch):
    """fp8_blockwise's activation and gradient pairs (1x128 blocks along features for Fprop / Dgrad, along
    tokens for Wgrad) from one read of X and of dY (quantize_blockwise_rowcol), and, where that does not
    apply, the Wgrad copies straight into their transposed layout (quantize_blockwise_t): the layer's
    output and gradients equal those of the generic path (Xᵀ and dYᵀ materialized, then quantized) bit
    for bit."""
    from nvfp4train.precision import operands, pairs
    from tests.precision.helpers import inputs, load_preset, make_layer, run

    monkeypatch.setattr(operands, "QUANT_IMPL", "triton")
    policy = load_preset("fp8_blockwise", bf16_first=0, bf16_last=0)
    x, grad = inputs(tokens=256, in_f=128, out_f=256)
    real_fwd, real_bwd, real_t = pairs.fprop_and_wgrad_x, pairs.dgrad_and_wgrad_dy, operands._fused_fp8_columnwise
    used = {"fwd": [], "bwd": [], "t": []}
    routes = {
        "one read": (
            lambda *a: used["fwd"].append(real_fwd(*a)) or used["fwd"][-1],
            lambda *a: used["bwd"].append(real_bwd(*a)) or used["bwd"][-1],
            real_t,
        ),
        "transposed": (lambda *a: None, lambda *a: None, lambda *a: used["t"].append(real_t(*a)) or used["t"][-1]),
        "generic": (lambda *a: None, lambda *a: None, lambda *a: False),
    }
    results = {}
    for name, (fwd, bwd, t) in routes.items():
        monkeypatch.setattr(pairs, "fprop_and_wgrad_x", fwd)
        monkeypatch.setattr(pairs, "dgrad_and_wgrad_dy", bwd)
        monkeypatch.setattr(operands, "_fused_fp8_columnwise", t)
        results[name] = run(make_layer(policy, 128, 256).to(DEVICE), x.to(DEVICE), grad.to(DEVICE))
    assert [u is not None for u in used["fwd"] + used["bwd"]] == [True, True] and sum(used["t"]) == 2
    for route in ("one read", "transposed"):
        for name, a, b in zip(("y", "dx", "dw"), results[route], results["generic"]):
            assert_same(a, b.cpu(), f"fp8_blockwise {route} {name}")


@kernel_test
@pytest.mark.parametrize("rowwise_dense, columnwise_dense", [(False, False), (True, False), (True, True)])
def test_rowwise_and_rht_t_from_one_read_equal_the_separate_quantizers(rowwise_dense, columnwise_dense):
    from nvfp4train.formats import kernels

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(64, 80, generator=gen)
    x[::5, ::7] *= 100
    x = x.to(torch.bfloat16)
    kw = dict(rowwise_dense=rowwise_dense, columnwise_dense=columnwise_dense, out_dtype=torch.float32)
    row, col = nvfp4.quantize_rowwise_and_rht_t(x.to(DEVICE), impl="triton", **kw)
    ref_row, ref_col = nvfp4.quantize_rowwise_and_rht_t(x, impl="reference", **kw)

    def parts(q):
        if isinstance(q, tuple):
            return list(q)
        return [q.codes, q.scales.view(torch.uint8), q.amax, q.global_decode_scale]

    for name, got, want in (("rowwise", row, ref_row), ("columnwise", col, ref_col)):
        for i, (a, b) in enumerate(zip(parts(got), parts(want))):
            assert_same(a, b, f"{name} part {i}")
    # SR: each copy draws from its own Philox seed, the bits the separate kernels draw from it.
    seeds = torch.tensor([11, 12], device=DEVICE)
    (row_values, _, _), (col_codes, _, _, _) = kernels.rht.nvfp4_t(
        x.to(DEVICE),
        hadamard.resolve_signs(16),
        "sr",
        dense=False,
        rowwise=True,
        rowwise_dense=True,
        out_dtype=torch.float32,
        seeds=seeds,
    )
    alone_row, _, _ = kernels.nvfp4.quantize(x.to(DEVICE), 1, "sr", dense=True, seed=seeds[1:], out_dtype=torch.float32)
    alone_col = kernels.rht.nvfp4_t(x.to(DEVICE), hadamard.resolve_signs(16), "sr", dense=False, seeds=seeds[:1])
    assert_same(row_values, alone_row.cpu(), "sr rowwise")
    assert_same(col_codes, alone_col[0].cpu(), "sr columnwise")
