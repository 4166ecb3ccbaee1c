"""partial_sums.sum_partials (the Triton column sum of the norm's and conv's partial gradients) against a
float64 sum: row counts above, at and below a load's rows, column counts that no strip divides, FP32 and
BF16 results, and the same bits on a second call. On CPU in Triton's interpreter (a subprocess with
TRITON_INTERPRET=1), on a GPU natively (marked gpu)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import run_check_in_triton_interpreter

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def check(device: str) -> None:
    from nvfp4train.model.partial_sums import SUM_COLS, SUM_ROWS, sum_partials

    gen = torch.Generator().manual_seed(0)
    shapes = ((1, 5), (SUM_ROWS, SUM_COLS), (2 * SUM_ROWS + 3, 3 * SUM_COLS - 1), (40, 7, 4))  # the last: conv's dw
    for shape in shapes:
        partial = (torch.randn(shape, generator=gen) * 100).to(device)
        want = partial.double().sum(0)
        for dtype in (torch.float32, torch.bfloat16):
            got = sum_partials(partial, dtype)
            assert got.dtype == dtype and got.shape == shape[1:], (got.dtype, got.shape, shape)
            # FP32 adds in any order: within rows * eps of the sum of magnitudes
            tol = shape[0] * 2**-23 * partial.abs().double().sum(0)
            if dtype == torch.bfloat16:
                tol = tol + want.abs() * 2**-8  # and half a bf16 ulp
            err = (got.double() - want).abs()
            assert (err <= tol).all(), f"{shape} {dtype}: max error {err.max().item()}"
            assert torch.equal(sum_partials(partial, dtype), got), f"{shape} {dtype}: not repeatable"


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_sum_partials_in_the_interpreter():
    run_check_in_triton_interpreter("tests.model.test_partial_sums")


@pytest.mark.gpu
def test_sum_partials_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check("cuda")
