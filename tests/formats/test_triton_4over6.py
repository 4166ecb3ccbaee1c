"""The Triton quantizer under TE's newer options (4over6, the 256 bound, row scaling) gives the golden
vectors' bits (golden/te_nvfp4_4over6/): codes, scale bytes, amax and global decode scale, rowwise and
columnwise, and fake_quantize's dense values.

On a GPU (``pytest -m gpu tests/formats/test_triton_4over6.py``) a family set runs on CUDA tensors: every
one of the 13 configurations in both dtypes (rowwise and columnwise) and on ragged rows. The error mode and
row scaling are constexprs, the bound a run-time argument, so the set compiles one variant per mode x scaling
x tile height x output kind x dtype that it meets, not one per case; the full 528-case sweep is the CPU
reference's (test_golden_4over6.py). On CPU ``test_4over6_kernel_in_the_triton_interpreter`` re-runs this
file with ``TRITON_INTERPRET=1`` on a few cases that cover every option (the interpreter takes seconds a
launch).
"""

from __future__ import annotations

import re

import pytest
import torch

from nvfp4train.formats import nvfp4

from .conftest import INTERPRETING, golden_4over6_manifest, kernel_test, rerun_in_triton_interpreter
from .test_golden_4over6 import check_case

DEVICE = torch.device("cpu" if INTERPRETING else "cuda")


def _interpreter_cases() -> list[str]:
    """One case for each option family in the interpreter: both error modes, both tiles, both bounds,
    row scaling with and without 4over6, bf16, ties (grid46), ragged rows."""
    cases = golden_4over6_manifest()["cases"]
    want = [
        ("4o6-mae-1x16-b256", "outliers", "float32", False),
        ("4o6-mse-16x16-b448", "grid46", "bfloat16", False),
        ("rowscaled-1x16", "zero_rows", "bfloat16", False),
        ("rowscaled-4o6-mse-1x16-b256", "heavy", "float32", True),
    ]
    return [next(c["name"] for c in cases if (c["config"], c["kind"], c["dtype"], c["ragged"]) == w) for w in want]


def _family_cases() -> list[str]:
    """The GPU set: for each configuration one rowwise + columnwise case per dtype and one ragged case, the
    input kinds cycled over the configurations (so ties, zero rows, outliers... each meet several)."""
    cases = golden_4over6_manifest()["cases"]
    configs = list(dict.fromkeys(c["config"] for c in cases))
    kinds = list(dict.fromkeys(c["kind"] for c in cases))
    picked = []
    for j, config in enumerate(configs):
        mine = [c for c in cases if c["config"] == config]
        for d, dtype in enumerate(("float32", "bfloat16")):
            full = [c for c in mine if c["dtype"] == dtype and not c["ragged"]]
            picked.append(next(c for c in full if c["kind"] == kinds[(2 * j + d) % len(kinds)]))
        ragged = [c for c in mine if c["ragged"]]
        if ragged:
            picked.append(ragged[(2 * j + 5) % len(ragged)])
    return [c["name"] for c in picked]


FAMILY_CASES = _family_cases()


def test_the_gpu_case_set_covers_every_option_family():
    """Guards the subset: all 13 configurations in both dtypes with their columnwise copy, and every
    configuration that has ragged cases with one of them."""
    cases = {c["name"]: c for c in golden_4over6_manifest()["cases"]}
    picked = [cases[name] for name in FAMILY_CASES]
    configs = {c["config"] for c in cases.values()}
    assert len(configs) == 13 and len(set(FAMILY_CASES)) == len(FAMILY_CASES)
    full = {(c["config"], c["dtype"]) for c in picked if c["columnwise"]}
    assert full == {(config, dtype) for config in configs for dtype in ("float32", "bfloat16")}
    with_ragged = {c["config"] for c in cases.values() if c["ragged"]}
    assert {c["config"] for c in picked if c["ragged"]} == with_ragged and len(with_ragged) == 9
    assert {c["kind"] for c in picked} == {c["kind"] for c in cases.values()}


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_4over6_kernel_in_the_triton_interpreter():
    """Under a minute on a 2-core CPU (4 golden cases and the larger tensor)."""
    pytest.importorskip("triton")
    summary = rerun_in_triton_interpreter(__file__, timeout=300)
    assert re.fullmatch(r"\d+ passed, 2 skipped in .*", summary), summary


@kernel_test
@pytest.mark.parametrize("name", _interpreter_cases() if INTERPRETING else FAMILY_CASES)
def test_triton_matches_the_4over6_golden_vectors(golden_4over6, name):
    check_case(golden_4over6, name, impl="triton", device=DEVICE)


@kernel_test
def test_triton_4over6_on_a_larger_tensor_matches_the_reference():
    """Several programs, a ragged last program column, 3-d input, both error modes."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 12, 272, generator=gen) * torch.logspace(-3, 2, 272)).to(torch.bfloat16)
    for options in (
        {"four_over_six": "mae", "scale_bound": 256},
        {"four_over_six": "mse", "scale_bound": 448, "row_scaled": True},
        {"row_scaled": True},
    ):
        want = nvfp4.quantize(x, impl="reference", **options)
        got = nvfp4.quantize(x.to(DEVICE), impl="triton", **options)
        assert torch.equal(got.codes.cpu(), want.codes), options
        assert torch.equal(got.scales.view(torch.uint8).cpu(), want.scales.view(torch.uint8)), options
        assert torch.equal(got.global_decode_scale.cpu(), want.global_decode_scale), options


def extreme_amax_tensors(rows: int = 32, cols: int = 256):
    """(name, x): tensors whose amax is near FLT_MAX or tiny, so that some 4over6 error values overflow or turn
    subnormal (the kernels' exact path), block maxima spread over 4 decades, and a row of its own smaller scale."""
    gen = torch.Generator().manual_seed(1)
    for top in (3e38, 2.0**120, 2.0**-118, 2.0**-124):
        x = torch.randn(rows, cols, generator=gen)
        spread = torch.logspace(-4, 0, rows * cols // 16, dtype=torch.float64)[
            torch.randperm(rows * cols // 16, generator=gen)
        ]
        x = x * spread.float().reshape(rows, cols // 16).repeat_interleave(16, 1)
        x = x / x.abs().max() * top
        x[1] *= 2.0**-30
        yield f"amax {top:g}", x


@kernel_test
def test_triton_4over6_at_extreme_amax_matches_the_reference():
    """Error values that overflow to Inf or land among subnormals: the kernel's exact path, per tensor and per row."""
    for name, x in extreme_amax_tensors():
        for options in (
            {"four_over_six": "mae", "scale_bound": 256},
            {"four_over_six": "mse", "scale_bound": 448},
            {"four_over_six": "mae", "scale_bound": 448, "tile": (16, 16)},
            {"four_over_six": "mae", "scale_bound": 256, "row_scaled": True},
        ):
            want = nvfp4.quantize(x, impl="reference", **options)
            got = nvfp4.quantize(x.to(DEVICE), impl="triton", **options)
            where = f"{name} {options}"
            assert torch.equal(got.scales.view(torch.uint8).cpu(), want.scales.view(torch.uint8)), where
            assert torch.equal(got.codes.cpu(), want.codes), where
            assert torch.equal(got.global_decode_scale.cpu(), want.global_decode_scale), where


@pytest.mark.parametrize("scale_bound", [256, 448])
def test_the_kernels_fused_division_by_6b_rounds_correctly(scale_bound):
    """kernels/nvfp4._div_six_b on the GPU: q = p * fl(1/(6B)), then fma(fma(q, -6B, p), fl(1/(6B)), q), for every
    FP32 significand of p (the exponent only scales all of it while it stays normal), against FP32 division. The
    FMAs are exact in float64: the products of two FP32 values are, the residual is a tiny exact difference, and
    the last sum is checked for a float64 rounding onto an FP32 midpoint (none)."""
    import numpy as np

    c = np.float32(6.0 * scale_bound)
    r = np.float32(1.0) / c
    p = (np.arange(2**23, 2**24, dtype=np.float64) * 2.0**-23).astype(np.float32)
    q = (p.astype(np.float64) * np.float64(r)).astype(np.float32)
    residual64 = p.astype(np.float64) - q.astype(np.float64) * np.float64(c)
    residual = residual64.astype(np.float32)
    assert np.array_equal(residual.astype(np.float64), residual64)
    product = residual.astype(np.float64) * np.float64(r)
    total = product + q.astype(np.float64)
    rounded = total.astype(np.float32)
    exact_sum = (total - q.astype(np.float64)) == product
    for neighbour in (np.nextafter(rounded, np.float32(np.inf)), np.nextafter(rounded, np.float32(-np.inf))):
        midpoint = (rounded.astype(np.float64) + neighbour.astype(np.float64)) / 2
        assert not np.any((total == midpoint) & ~exact_sum)
    assert np.array_equal(rounded, p / c)


@pytest.mark.slow  # ~15 s with an empty Triton cache
@pytest.mark.skipif(INTERPRETING, reason="compiles for the GPU")
def test_4over6_kernel_compiles_for_sm90_with_one_vector_read_and_exact_division():
    """The kernel compiles for an H100 without a GPU; its PTX divides only with div.rn, and each thread
    reads its 32 bf16 elements as 4 16-byte vectors (the single read the kernel is built on), plus a few
    FP32 amax words; the only other reads are the exact path's (a loop, rarely run), one bf16 element of each of
    the thread's 2 blocks an iteration."""
    pytest.importorskip("triton")
    from nvfp4train.formats import kernels
    from nvfp4train.formats.kernels.sm90 import NVFP4_TE_ARGS, compile_sm90

    blocks = {"BLOCK_R": kernels.common.BLOCK_ROWS, "BLOCK_C": kernels.common.BLOCK_COLS, "CHUNK": 8}
    for constexprs in (
        {"MODE": 1, "ROW_SCALED": True, "TILE_ROWS": 1, "DENSE": True},
        {"MODE": 2, "ROW_SCALED": False, "TILE_ROWS": 16, "DENSE": False},
    ):
        ptx = compile_sm90(kernels.nvfp4._nvfp4_te_kernel, NVFP4_TE_ARGS, {**constexprs, **blocks}, aligned=True)
        ptx = ptx.asm["ptx"]
        assert "div.full" not in ptx and "div.approx" not in ptx and "div.rn.f32" in ptx, constexprs
        loads = re.findall(r"ld\.global\.\S+", ptx)
        others = [load for load in loads if load not in ("ld.global.v4.b32", "ld.global.b16")]
        assert loads.count("ld.global.v4.b32") == 4 and loads.count("ld.global.b16") == 2, loads
        assert set(others) <= {"ld.global.b32"} and len(others) <= 4, loads
