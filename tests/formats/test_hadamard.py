"""Random Hadamard transform: orthogonality, TE's sign vector, GEMM invariance, dtype rounding,
seeds and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nvfp4train.formats import hadamard

TE_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]


@pytest.mark.parametrize("d", [2, 4, 16, 32, 128])
def test_matrix_is_orthogonal(d):
    m = hadamard.rht_matrix(d, dtype=torch.float64)
    assert torch.allclose(m @ m.T, torch.eye(d, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(m.abs(), torch.full((d, d), d**-0.5, dtype=torch.float64))


def test_d16_is_exact_and_uses_te_signs_on_rows():
    m = hadamard.rht_matrix(16)  # entries ±1/4: exact in any float dtype
    assert torch.equal(m @ m.T, torch.eye(16))
    h = hadamard.sylvester(16)
    assert torch.equal(h @ h.T, 16 * torch.eye(16))
    assert torch.equal(m * 4, torch.diag(torch.tensor(TE_SIGNS, dtype=torch.float32)) @ h)
    assert torch.equal(hadamard.rht_matrix(16, dtype=torch.bfloat16).float(), m)


def test_transform_leaves_gemm_along_the_transformed_dim_unchanged():
    gen = torch.Generator().manual_seed(0)
    a, b = (
        torch.randn(8, 64, generator=gen, dtype=torch.float64),
        torch.randn(5, 64, generator=gen, dtype=torch.float64),
    )
    for d in (16, 32):
        assert torch.allclose(hadamard.rht(a, d) @ hadamard.rht(b, d).T, a @ b.T, atol=1e-10)


def test_spreads_a_single_outlier_over_its_block():
    x = torch.zeros(2, 32)
    x[0, 5] = 100.0
    y = hadamard.rht(x, d=16)
    assert torch.equal(y[0, :16].abs(), torch.full((16,), 25.0))  # 100 / sqrt(16)
    assert not y[0, 16:].any() and not y[1].any()


def test_output_is_the_fp32_sum_in_index_order_rounded_to_the_input_dtype():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = hadamard.rht(x, d=16)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    m = hadamard.rht_matrix(16).numpy()
    blocks = x.float().reshape(-1, 16).numpy()
    for b, block in enumerate(blocks):  # an independent scalar loop in numpy float32
        for j in range(16):
            acc = np.float32(block[0]) * m[0, j]
            for i in range(1, 16):
                acc = np.float32(acc + np.float32(block[i]) * m[i, j])
            assert torch.tensor(float(acc)).to(torch.bfloat16) == y.reshape(-1, 16)[b, j]


def test_fp32_accumulation_differs_from_the_exact_sum_where_it_rounds():
    """(2^26 + 2^18 + 1) / 4 = 2^24 + 2^16 + 1/4: FP32 drops the 1/4 (spacing 2 there), leaving the
    bf16 midpoint 2^24 + 2^16, which rounds to even (2^24); the exact sum rounds up to 2^24 + 2^17."""
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    x[0, :3] = torch.tensor([2.0**26, 2.0**18, 1.0])
    assert hadamard.rht(x)[0, 0] == 2.0**24
    exact = x.double() @ hadamard.rht_matrix(16, dtype=torch.float64)
    assert exact[0, 0] == 2.0**24 + 2.0**16 + 0.25  # above the midpoint: correctly rounded, 2^24 + 2^17


def test_signs_from_seed_and_explicit_vector():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    # d != 16 defaults to a documented seed; an int picks another seed; a tensor is used as is.
    assert torch.equal(hadamard.rht(x, d=32), hadamard.rht(x, d=32, signs=hadamard.DEFAULT_SIGN_SEED))
    assert torch.equal(hadamard.rht(x, d=32, signs=3), hadamard.rht(x, d=32, signs=hadamard.random_signs(32, 3)))
    assert not torch.equal(hadamard.random_signs(32, 3), hadamard.random_signs(32, 4))
    assert torch.equal(hadamard.rht(x, signs=torch.tensor(TE_SIGNS)), hadamard.rht(x))
    assert not torch.equal(hadamard.rht(x, signs=torch.ones(16)), hadamard.rht(x))
    assert set(hadamard.random_signs(64, 9).tolist()) == {-1.0, 1.0}


def test_a_layers_host_tuple_of_signs_resolves_once_and_bad_ones_still_fail_each_time():
    # A layer passes its signs as a host tuple at every Wgrad operand: resolved once, the same vector after.
    signs = tuple(float(s) for s in hadamard.random_signs(16, 5).tolist())
    first = hadamard.resolve_signs(16, signs)
    assert first is hadamard.resolve_signs(16, signs)
    assert torch.equal(first, hadamard.random_signs(16, 5)) and first.dtype == torch.float32
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(hadamard.rht(x, signs=signs), hadamard.rht(x, signs=torch.tensor(signs)))
    for _ in range(2):  # a refused tuple is not remembered as resolved
        with pytest.raises(ValueError, match="signs must be"):
            hadamard.resolve_signs(16, (1.0, 2.0) * 8)
        with pytest.raises(ValueError, match="signs must be"):
            hadamard.resolve_signs(16, (1.0,) * 8)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: hadamard.rht(torch.randn(4, 24), d=12), "power of two"),
        (lambda: hadamard.rht(torch.randn(4, 24), d=16), "multiple of d=16"),
        (lambda: hadamard.rht(torch.randn(4, 16), signs=torch.ones(8)), "signs"),
        (lambda: hadamard.rht(torch.randn(4, 16), signs=torch.full((16,), 2.0)), "signs"),
    ],
)
def test_bad_input_raises_one_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_rht_impl_choices():
    x = torch.randn(4, 64)
    assert torch.equal(hadamard.rht(x, 16, impl="auto"), hadamard.rht(x, 16, impl="reference"))  # CPU: the loop
    with pytest.raises(ValueError, match="impl='bogus' is not supported"):
        hadamard.rht(x, 16, impl="bogus")
    with pytest.raises(ValueError, match=r"impl='triton' takes d in \(16, 32\)"):
        hadamard.rht(x, 64, impl="triton")
    with pytest.raises(ValueError, match="impl='triton' takes"):
        hadamard.rht(x.double(), 16, impl="triton")
    assert hadamard.rht(x.double(), 16).dtype == torch.float64  # "auto" leaves float64 to the loop
