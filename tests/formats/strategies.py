"""Hypothesis strategies and independent checkers shared by the format tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
# All finite non-negative E4M3 values, indexed by their bit pattern 0x00..0x7E.
E4M3_TABLE = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)


def nearest_even(table: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Index of the nearest entry of sorted ``table`` for each value; ties to the even index.
    A brute-force oracle, independent of the implementation's rounding trick."""
    values = values.to(torch.float64).reshape(-1, 1)
    distance = (table.reshape(1, -1) - values).abs()
    best = distance.min(dim=1, keepdim=True).values
    is_best = distance == best
    index = torch.arange(table.numel()).expand_as(distance)
    # Among the (at most two) nearest entries, prefer an even index.
    score = torch.where(is_best, index + (index % 2) * table.numel(), 10 * table.numel())
    return score.argmin(dim=1)


@st.composite
def tensors(draw, row_multiple: int = 16, col_multiple: int = 32, dtypes=(torch.float32, torch.bfloat16)):
    """2-D tensors over shapes, dtypes, magnitudes (2^-30..2^30) and distributions."""
    rows = row_multiple * draw(st.integers(1, 4))
    cols = col_multiple * draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(dtypes))
    kind = draw(st.sampled_from(["normal", "heavy", "outliers", "sparse", "uniform"]))
    log2_scale = draw(st.integers(-30, 30))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    if kind == "heavy":
        x = x / torch.rand(rows, cols, generator=gen, dtype=torch.float64).clamp(min=1e-3) ** 1.5
    elif kind == "outliers":
        x = torch.where(torch.rand(rows, cols, generator=gen) < 0.02, x * 300, x)
    elif kind == "sparse":
        x = torch.where(torch.rand(rows, cols, generator=gen) < 0.7, torch.zeros_like(x), x)
    elif kind == "uniform":
        x = torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 2 - 1
    return (x * 2.0**log2_scale).to(dtype)
