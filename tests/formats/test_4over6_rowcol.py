"""`nvfp4.quantize_tiles_rowcol`: both copies of a 4over6 weight with 16x16 tiles (Fprop's W, Dgrad's Wᵀ) from
one pass give the bits of the two separate quantizations, `quantize(w)` and `quantize(w.T)`, on every golden
4over6 16x16 case (and TE's own columnwise bytes), on random tensors with ties, padding and both dtypes, and on
tiles whose two copies choose different candidates (TE sums a tile's errors along its rows for W and along its
columns for Wᵀ). The reference only; the Triton kernel: test_triton_4over6_rowcol.py.
"""

from __future__ import annotations

import pytest
import torch

from nvfp4train.formats import nvfp4

from .conftest import golden_4over6_manifest

# Two 16x16 tiles (MAE, bound 256; the rest of each tile 0) whose W copy and Wᵀ copy pick different candidates:
# the first keeps map-to-6 for W and takes map-to-4 for Wᵀ, the second the other way round. Found by a search
# that balanced a tile's two candidates' errors to within the rounding of their sums.
SPLIT_TILES = (
    (
        (0, 0, "0x1.0000000000000p+2"), (1, 5, "0x1.c296100000000p+1"), (2, 0, "0x1.c166c20000000p+1"),
        (2, 7, "0x1.9c93fa0000000p+1"), (3, 3, "0x1.6d18960000000p-1"), (3, 6, "0x1.c45cfe0000000p-2"),
        (4, 5, "0x1.5e02f00000000p+0"), (4, 14, "0x1.0e32540000000p-1"), (5, 3, "0x1.8a4f480000000p+0"),
        (5, 6, "0x1.2cd5d00000000p+1"), (5, 14, "0x1.2f7e180000000p+0"), (6, 11, "0x1.4398a60000000p+0"),
        (7, 6, "0x1.38839a0000000p+0"), (7, 13, "0x1.9976420000000p+1"), (8, 1, "0x1.5286da0000000p-1"),
        (8, 2, "0x1.0aa7920000000p+1"), (8, 14, "0x1.d5351e0000000p+1"), (8, 15, "0x1.259d760000000p+0"),
        (9, 5, "0x1.2f0bdc0000000p+0"), (9, 10, "0x1.8a953e0000000p+0"), (10, 14, "0x1.979e9a0000000p+1"),
        (12, 12, "0x1.5264000000000p+0"), (12, 14, "0x1.ce9de00000000p+0"), (13, 15, "0x1.6f7a920000000p+1"),
        (14, 5, "0x1.3867fe0000000p+1"), (15, 2, "0x1.61f7000000000p+1"), (15, 3, "0x1.41b5c40000000p+1"),
        (15, 15, "0x1.bab6720000000p+1"),
    ),
    (
        (0, 0, "0x1.0000000000000p+2"), (0, 4, "0x1.2feada0000000p-2"), (0, 7, "0x1.370d9a0000000p+0"),
        (1, 1, "0x1.70b5aa0000000p+1"), (1, 15, "0x1.6c23560000000p+0"), (4, 14, "0x1.b7f1e80000000p+1"),
        (5, 11, "0x1.ccd8060000000p+0"), (6, 0, "0x1.4b5f740000000p+1"), (6, 5, "0x1.0876380000000p+1"),
        (6, 7, "0x1.b32e700000000p+0"), (6, 8, "0x1.d2b0760000000p+1"), (6, 14, "0x1.7fe3720000000p-1"),
        (8, 2, "0x1.9aed5a0000000p+0"), (8, 3, "0x1.b39b820000000p-2"), (8, 8, "0x1.dbf52e0000000p+0"),
        (9, 6, "0x1.b65af80000000p-3"), (10, 3, "0x1.7607500000000p+1"), (11, 6, "0x1.2654da0000000p+1"),
        (12, 11, "0x1.a3f9800000000p-3"), (13, 9, "0x1.5426280000000p+1"), (13, 10, "0x1.c1a0060000000p+1"),
        (14, 1, "0x1.adb9980000000p+1"), (14, 6, "0x1.0a5b2c0000000p+1"), (14, 13, "0x1.6e327c0000000p+1"),
        (15, 14, "0x1.e82d060000000p-2"), (15, 15, "0x1.71f49e0000000p+1"),
    ),
)  # fmt: skip


def split_tiles() -> torch.Tensor:
    """The two SPLIT_TILES side by side, above a tile row of small noise: [32, 32] FP32."""
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(0)) * 0.01
    x[:16] = 0
    for t, tile in enumerate(SPLIT_TILES):
        for r, c, value in tile:
            x[r, 16 * t + c] = float.fromhex(value)
    return x


def golden_rowcol_cases() -> list[str]:
    return [
        c["name"]
        for c in golden_4over6_manifest()["cases"]
        if tuple(c["tile"]) == (16, 16) and c["four_over_six"] is not None and c["columnwise"]
    ]


def _padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


def check_rowcol(x, mode, bound, *, dense, row_width=None, col_width=None, impl="reference", device="cpu"):
    """quantize_tiles_rowcol(x) on ``device`` against the two separate reference calls on the padded tensors."""
    rows, cols = x.shape
    padded_rows = -(-rows // 16) * 16
    row_width = row_width or -(-cols // 16) * 16
    col_width = col_width or padded_rows
    xp = _padded(x, padded_rows, row_width)
    xt = _padded(xp.t(), row_width, col_width)
    got = nvfp4.quantize_tiles_rowcol(
        x.to(device), mode, bound, dense=dense, row_width=row_width, col_width=col_width, impl=impl
    )
    options = {"four_over_six": mode, "scale_bound": bound}
    for side, want_x, q in (("rowwise", xp, got[0]), ("columnwise", xt, got[1])):
        where = f"{side} {tuple(x.shape)} {x.dtype} {mode} b{bound} dense={dense} impl={impl}"
        if dense:
            values, s_dec = nvfp4.fake_quantize(want_x, (16, 16), impl="reference", **options)
            assert q[0].dtype == x.dtype and torch.equal(q[0].cpu(), values), where
            assert torch.equal(q[1].cpu(), s_dec), where
            continue
        want = nvfp4.quantize(want_x, (16, 16), impl="reference", **options)
        assert q.shape == want.shape and q.tile == (16, 16), where
        assert (q.four_over_six, q.scale_bound, q.row_scaled) == (mode, bound, False), where
        got_scales, want_scales = q.scales.view(torch.uint8).cpu(), want.scales.view(torch.uint8)
        assert torch.equal(got_scales, want_scales), f"{where}: {(got_scales != want_scales).sum()} scale bytes differ"
        assert torch.equal(q.codes.cpu(), want.codes), (
            f"{where}: {(q.codes.cpu() != want.codes).sum()} code bytes differ"
        )
        assert torch.equal(q.amax.cpu(), want.amax) and torch.equal(
            q.global_decode_scale.cpu(), want.global_decode_scale
        )
    if not dense:
        assert got[0].amax.data_ptr() != got[1].amax.data_ptr()  # tensors of their own, as two calls give
    return got


def check_golden_case(golden_4over6, name, impl="reference", device="cpu") -> None:
    """Both copies against the separate calls and against TE's own rowwise and columnwise bytes."""
    manifest, tensors = golden_4over6
    meta = next(c for c in manifest["cases"] if c["name"] == name)
    x = tensors["x/" + meta["x"]]
    row, col = check_rowcol(x, meta["four_over_six"], meta["scale_bound"], dense=False, impl=impl, device=device)
    for side, q in (("rowwise", row), ("columnwise", col)):
        assert torch.equal(q.codes.cpu(), tensors[f"{name}/{side}_codes"]), f"{name} {side} codes"
        assert torch.equal(q.scales.view(torch.uint8).cpu(), tensors[f"{name}/{side}_scales_e4m3"]), f"{name} {side}"
    check_rowcol(x, meta["four_over_six"], meta["scale_bound"], dense=True, impl=impl, device=device)


def test_golden_rowcol_cases_are_the_16x16_4over6_ones():
    names = golden_rowcol_cases()
    assert len(names) == 96  # 2 modes x 2 bounds x input kinds x 2 dtypes, each with TE's columnwise copy


@pytest.mark.parametrize("name", golden_rowcol_cases())
def test_reference_rowcol_matches_separate_calls_and_te(golden_4over6, name):
    check_golden_case(golden_4over6, name)


@pytest.mark.parametrize("mode", ["mae", "mse"])
@pytest.mark.parametrize("bound", [256, 448])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_rowcol_on_random_tensors_with_ties_and_padding(mode, bound, dtype):
    gen = torch.Generator().manual_seed(7)
    # columns of widely different scales; a band of values on the shared 4/6 grid (ties: both candidates exact);
    # zero tiles; the ragged shape and the widths pad both copies
    x = torch.randn(40, 88, generator=gen) * torch.logspace(-3, 2, 88)
    x[:16, :32] = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[torch.randint(0, 8, (16, 32), generator=gen)]
    x[16:32, 48:64] = 0
    x = x.to(dtype)
    for dense in (False, True):
        check_rowcol(x, mode, bound, dense=dense)
        check_rowcol(x, mode, bound, dense=dense, row_width=128, col_width=64)


def test_the_two_copies_of_a_tile_can_choose_differently():
    """Guards the oracle: W's copy and Wᵀ's copy of the same tile pick different candidates (in both
    directions), so a quantizer that gave Wᵀ the transpose of W's choice would fail here."""
    row, col = check_rowcol(split_tiles(), "mae", 256, dense=False)
    row_choice = row.scales.view(torch.uint8)[0, :2]  # tile (0, t)'s byte in W's copy
    col_choice = col.scales.view(torch.uint8)[[0, 16], 0]  # the same tiles' bytes in Wᵀ's copy
    assert (row_choice < col_choice).tolist() == [True, False] and (row_choice > col_choice).tolist() == [False, True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"four_over_six": None}, "four_over_six=None is not supported; allowed: 'mae', 'mse'"),
        ({"scale_bound": 300}, "scale_bound=300 is not supported"),
        ({"row_width": 40}, "row_width=40 must be a multiple of 16 and at least 32"),
        ({"col_width": 16}, "col_width=16 must be a multiple of 16 and at least 32"),
        ({"impl": "fast"}, "impl='fast' is not supported"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match="^nvfp4.quantize_tiles_rowcol") as info:
        nvfp4.quantize_tiles_rowcol(torch.randn(32, 32), **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_weight_must_be_2d():
    with pytest.raises(ValueError, match="non-empty 2-D tensor, got shape \\(32,\\)"):
        nvfp4.quantize_tiles_rowcol(torch.randn(32))
