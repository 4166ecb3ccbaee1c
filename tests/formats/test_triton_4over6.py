"""The Triton quantizer under TE's newer options (4over6, the 256 bound, row scaling) gives the golden
vectors' bits (golden/te_nvfp4_4over6/): codes, scale bytes, amax and global decode scale, rowwise and
columnwise, and fake_quantize's dense values.

On a GPU (``pytest -m gpu tests/formats/test_triton_4over6.py``) every golden case runs on CUDA tensors;
on CPU ``test_4over6_kernel_in_the_triton_interpreter`` re-runs this file with ``TRITON_INTERPRET=1`` on a
few cases that cover every option (the interpreter takes seconds a launch).
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from nvfp4train.formats import nvfp4

from .conftest import INTERPRETING, golden_4over6_manifest, rerun_in_triton_interpreter
from .test_golden_4over6 import check_case

DEVICE = torch.device("cpu" if INTERPRETING else "cuda")


def kernel_test(fn):
    """A check of the kernel: runs in the interpreter subprocess, or on a GPU (marked gpu)."""
    if INTERPRETING:
        return fn
    marks = (pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))
    return functools.reduce(lambda f, mark: mark(f), marks, fn)


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


ALL_CASES = [c["name"] for c in golden_4over6_manifest()["cases"]]


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_4over6_kernel_in_the_triton_interpreter():
    pytest.importorskip("triton")
    summary = rerun_in_triton_interpreter(__file__, timeout=900)
    assert re.fullmatch(r"\d+ passed, 1 skipped in .*", summary), summary


@kernel_test
@pytest.mark.parametrize("name", _interpreter_cases() if INTERPRETING else ALL_CASES)
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
