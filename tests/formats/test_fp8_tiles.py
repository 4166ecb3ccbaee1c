"""fp8.quantize_tiles_rowcol: blockwise FP8's weight (128x128 tiles) and its transpose from one read, the bits
of quantizing the zero-padded W and the zero-padded Wᵀ separately; the Triton kernel (on a GPU, or on CPU in
Triton's interpreter: `test_tiles_kernel_in_the_triton_interpreter` re-runs this file with TRITON_INTERPRET=1,
as tests/formats/test_triton.py does) gives the reference's bits, ragged shapes included."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from nvfp4train.formats import fp8

from .conftest import INTERPRETING, kernel_test, rerun_in_triton_interpreter

DEVICE = torch.device("cpu" if INTERPRETING else "cuda")
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def assert_same(got, want, what):
    """Bit for bit (FP8 codes as bytes; FP32 scales by their bits, any NaN matching any NaN)."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype in FP8:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    elif got.is_floating_point():
        assert torch.equal(got.isnan(), want.isnan()), what
        got, want = got.nan_to_num(0.0).view(torch.int32), want.nan_to_num(0.0).view(torch.int32)
    diff = int((got != want).sum())
    assert diff == 0, f"{what}: {diff} of {got.numel()} differ"


def weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random values with large, zero, tiny (the encode scale overflows), FP32-subnormal and non-finite tiles."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen)
    w[::5, ::11] *= 300
    w[:128, 128:256] = 0.0
    w[128:, :128] *= 1e-30
    w[:128, -40:] *= 1e-40
    w[rows - 3, 5] = float("nan")
    w[2, cols - 1] = float("inf")
    return w


# (rows, cols, row_width, col_width): ragged both ways (the padded rows and columns inside a tile), a K padding
# of whole tiles on either copy (what scaled_mm's GEMMs want: K a multiple of 512), and no padding at all
SHAPES = [(200, 300, 384, 256), (200, 300, 512, 512), (256, 128, 128, 256), (130, 129, 256, 256)]


@pytest.mark.parametrize("rows, cols, row_width, col_width", SHAPES)
def test_reference_is_the_padded_weight_and_its_transpose_quantized_apart(rows, cols, row_width, col_width):
    w = weight(rows, cols)
    (data, scales), (data_t, scales_t) = fp8.quantize_tiles_rowcol(
        w, row_width=row_width, col_width=col_width, impl="reference"
    )
    padded_rows = -(-rows // 128) * 128
    want = fp8.quantize_blockwise(F.pad(w, (0, row_width - cols, 0, padded_rows - rows)), (128, 128))
    want_t = fp8.quantize_blockwise(F.pad(w.t(), (0, col_width - rows, 0, row_width - cols)), (128, 128))
    assert data.shape == (padded_rows, row_width) and data_t.shape == (row_width, col_width)
    assert data_t.is_contiguous() and scales_t.is_contiguous()
    for what, got, expected in (
        ("data", data, want[0]),
        ("scales", scales, want[1]),
        ("data_t", data_t, want_t[0]),
        ("scales_t", scales_t, want_t[1]),
    ):
        assert_same(got, expected, what)
    assert not data_t[:, padded_rows:].view(torch.uint8).any() and bool((scales_t[:, padded_rows // 128 :] == 1).all())


@kernel_test
@pytest.mark.parametrize("dtype", FP8)
def test_tiles_kernel_same_bits_as_the_reference(dtype):
    for (rows, cols, row_width, col_width), source, pow2 in zip(
        SHAPES, (torch.float32, torch.bfloat16, torch.float16, torch.float32), (False, True, False, True)
    ):
        w = weight(rows, cols, seed=rows + cols).to(source)
        what = f"{source} {rows}x{cols} -> {row_width}, {col_width} pow2={pow2}"
        got = fp8.quantize_tiles_rowcol(
            w.to(DEVICE), dtype, pow2, row_width=row_width, col_width=col_width, impl="triton"
        )
        want = fp8.quantize_tiles_rowcol(w, dtype, pow2, row_width=row_width, col_width=col_width, impl="reference")
        for (name, g), w_ in zip((("data", got[0][0]), ("scales", got[0][1])), want[0]):
            assert_same(g, w_, f"{what} {name}")
        for (name, g), w_ in zip((("data_t", got[1][0]), ("scales_t", got[1][1])), want[1]):
            assert_same(g, w_, f"{what} {name}")


def test_bad_widths_are_refused_in_one_line():
    w = torch.zeros(200, 300)
    with pytest.raises(ValueError, match=r"row_width=256 must be a multiple of 128 and at least 300"):
        fp8.quantize_tiles_rowcol(w, row_width=256, impl="reference")
    with pytest.raises(ValueError, match=r"col_width=300 must be a multiple of 128"):
        fp8.quantize_tiles_rowcol(w, col_width=300, impl="reference")
    with pytest.raises(ValueError, match="must be 2-D"):
        fp8.quantize_tiles_rowcol(torch.zeros(2, 128, 128), impl="reference")


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_tiles_kernel_in_the_triton_interpreter():
    pytest.importorskip("triton")
    summary = rerun_in_triton_interpreter(__file__, timeout=600)
    assert re.fullmatch(r"\d+ passed, 1 skipped in .*", summary), summary
