"""The Triton kernel of `nvfp4.quantize_tiles_rowcol` (kernels/nvfp4.py, `_nvfp4_4over6_rowcol_kernel`) gives the
bits of the two separate reference quantizations of a 4over6 weight, `quantize(w)` and `quantize(w.T)` (16x16
tiles), and TE's golden rowwise and columnwise bytes: packed codes + scales and dense values, tiles whose two
copies choose differently, padding, both dtypes.

On CPU ``test_rowcol_kernel_in_the_triton_interpreter`` re-runs this file with ``TRITON_INTERPRET=1`` on a few
small cases; on a GPU (``pytest -m gpu tests/formats/test_triton_4over6_rowcol.py``) every golden 16x16 4over6
case, every mode x bound x dtype on random tensors, and a weight of several programs in both directions.
"""

from __future__ import annotations

import re

import pytest
import torch

from .conftest import INTERPRETING, golden_4over6_manifest, kernel_test, rerun_in_triton_interpreter
from .test_4over6_rowcol import check_golden_case, check_rowcol, golden_rowcol_cases, split_tiles
from .test_triton_4over6 import extreme_amax_tensors

DEVICE = torch.device("cpu" if INTERPRETING else "cuda")


def _interpreter_golden_case() -> str:
    """One golden case in the interpreter: ties (grid46), bf16, MSE with the 448 bound."""
    cases = golden_4over6_manifest()["cases"]
    return next(
        c["name"]
        for c in cases
        if (c["config"], c["kind"], c["dtype"]) == ("4o6-mse-16x16-b448", "grid46", "bfloat16") and c["columnwise"]
    )


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_rowcol_kernel_in_the_triton_interpreter():
    """Under a minute on a 2-core CPU (6 launches)."""
    pytest.importorskip("triton")
    summary = rerun_in_triton_interpreter(__file__, timeout=400)
    assert re.fullmatch(r"4 passed, 9 skipped in .*", summary), summary


@kernel_test
def test_rowcol_kernel_on_tiles_whose_copies_choose_differently():
    for dense in (False, True):
        check_rowcol(split_tiles(), "mae", 256, dense=dense, impl="triton", device=DEVICE)


@kernel_test
@pytest.mark.parametrize("name", [_interpreter_golden_case()] if INTERPRETING else golden_rowcol_cases())
def test_rowcol_kernel_matches_the_golden_vectors(golden_4over6, name):
    check_golden_case(golden_4over6, name, impl="triton", device=DEVICE)


@kernel_test
def test_rowcol_kernel_pads_both_copies():
    """A ragged row count, K padding of both copies, a ragged last program column (88 columns), bf16."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(40, 88, generator=gen) * torch.logspace(-3, 2, 88)).to(torch.bfloat16)
    x[16:32, 48:64] = 0
    check_rowcol(x, "mae", 256, dense=True, row_width=128, col_width=64, impl="triton", device=DEVICE)
    check_rowcol(x, "mae", 256, dense=False, row_width=96, col_width=80, impl="triton", device=DEVICE)


@kernel_test
def test_rowcol_kernel_at_extreme_amax():
    """Error values that overflow to Inf or land among subnormals (the kernel's exact path), both copies."""
    for _, x in extreme_amax_tensors(64, 256):
        check_rowcol(x, "mae", 448, dense=False, impl="triton", device=DEVICE)
        check_rowcol(x, "mae", 256, dense=True, impl="triton", device=DEVICE)


@pytest.mark.skipif(INTERPRETING, reason="GPU-sized")
@kernel_test
@pytest.mark.parametrize("mode", ["mae", "mse"])
@pytest.mark.parametrize("bound", [256, 448])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rowcol_kernel_on_a_weight_of_many_programs(mode, bound, dtype):
    """Several program rows and columns (BLOCK_COLS 256), an FP32 master weight and a bf16 one, ties included."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(272, 784, generator=gen) * torch.logspace(-4, 3, 784)
    x[:16, :64] = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[torch.randint(0, 8, (16, 64), generator=gen)]
    x = x.to(dtype)
    for dense in (False, True):
        check_rowcol(x, mode, bound, dense=dense, impl="triton", device=DEVICE)
        check_rowcol(x.t().contiguous(), mode, bound, dense=dense, col_width=800, impl="triton", device=DEVICE)
