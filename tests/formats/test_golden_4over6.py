"""Bit-exactness against Transformer Engine's reference for its newer NVFP4 options
(golden/te_nvfp4_4over6/): 4over6 (MAE and MSE, scale bound 256 and 448, 1x16 and 16x16 tiles),
row-scaled NVFP4 with and without 4over6, ragged row counts. Every code byte, scale byte, amax and
global decode scale, rowwise and columnwise (x.T), and the dequantized values.
"""

from __future__ import annotations

import pytest
import torch

from nvfp4train.formats import nvfp4

from .conftest import golden_4over6_manifest


def _case_names(predicate) -> list[str]:
    return [c["name"] for c in golden_4over6_manifest()["cases"] if predicate(c)]


FOUR_OVER_SIX = _case_names(lambda c: c["four_over_six"] is not None and not c["row_scaled"])
ROW_SCALED = _case_names(lambda c: c["row_scaled"] and c["four_over_six"] is None)
ROW_SCALED_FOUR_OVER_SIX = _case_names(lambda c: c["row_scaled"] and c["four_over_six"] is not None)


def _case(golden_4over6, name):
    manifest, tensors = golden_4over6
    meta = next(c for c in manifest["cases"] if c["name"] == name)
    fields = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(name + "/")}
    return meta, tensors["x/" + meta["x"]], fields


def options(meta) -> dict:
    return {
        "tile": tuple(meta["tile"]),
        "four_over_six": meta["four_over_six"],
        "scale_bound": meta["scale_bound"],
        "row_scaled": meta["row_scaled"],
    }


def assert_same_bits(q: nvfp4.NVFP4Tensor, fields: dict, side: str, where: str) -> None:
    where = f"{where} {side}"
    want = fields[f"{side}_scales_e4m3"]
    got = q.scales.view(torch.uint8)
    assert torch.equal(got, want), f"{where}: {(got != want).sum()} of {want.numel()} scale bytes differ"
    want = fields[f"{side}_codes"]
    assert torch.equal(q.codes, want), f"{where}: {(q.codes != want).sum()} of {want.numel()} code bytes differ"
    assert torch.equal(q.amax.reshape(-1), fields[f"{side}_amax"]), f"{where}: amax differs"
    assert torch.equal(q.global_decode_scale.reshape(-1), fields[f"{side}_global_decode_scale"]), (
        f"{where}: global decode scale differs"
    )


def check_case(golden_4over6, name, impl="reference", device="cpu") -> None:
    meta, x, fields = _case(golden_4over6, name)
    x = x.to(device)
    where = f"{name} ({meta['config']}, {meta['kind']}, {meta['dtype']}, shape {meta['shape']}, impl {impl})"
    q = nvfp4.quantize(x, impl=impl, **options(meta))
    assert_same_bits(_to_cpu(q), fields, "rowwise", where)
    dequant = q.dequantize().cpu()
    assert torch.equal(dequant, fields["rowwise_dequant"]), f"{where}: dequantized values differ"
    # fake_quantize gives the same e2m1 * scale_b as the packed tensor, and the same global scale
    values, s_dec = nvfp4.fake_quantize(x, out_dtype=torch.float32, impl=impl, **options(meta))
    assert torch.equal(values.cpu(), q.dequantize(apply_global_scale=False, impl="reference").cpu()), where
    assert torch.equal(s_dec.reshape(-1).cpu(), fields["rowwise_global_decode_scale"]), where
    if meta["columnwise"]:
        assert_same_bits(_to_cpu(nvfp4.quantize(x.t(), impl=impl, **options(meta))), fields, "columnwise", where)
    else:
        assert meta["ragged"] and "columnwise_codes" not in fields


def _to_cpu(q: nvfp4.NVFP4Tensor) -> nvfp4.NVFP4Tensor:
    return nvfp4.NVFP4Tensor(
        q.codes.cpu(),
        q.scales.cpu(),
        q.amax.cpu(),
        q.global_decode_scale.cpu(),
        q.shape,
        q.tile,
        q.four_over_six,
        q.scale_bound,
        q.row_scaled,
    )


@pytest.mark.parametrize("name", FOUR_OVER_SIX)
def test_four_over_six_matches_te_reference(golden_4over6, name):
    check_case(golden_4over6, name)


@pytest.mark.parametrize("name", ROW_SCALED)
def test_row_scaled_matches_te_reference(golden_4over6, name):
    check_case(golden_4over6, name)


@pytest.mark.parametrize("name", ROW_SCALED_FOUR_OVER_SIX)
def test_row_scaled_four_over_six_matches_te_reference(golden_4over6, name):
    check_case(golden_4over6, name)


def test_golden_4over6_covers_what_it_claims(golden_4over6):
    """Guards the oracle: every option family, both tiles and bounds, ties, ragged rows, and map-to-4
    really winning somewhere (else a quantizer that never picks it would pass)."""
    manifest, tensors = golden_4over6
    cases = manifest["cases"]
    assert len(cases) == 528 and len(FOUR_OVER_SIX) + len(ROW_SCALED) + len(ROW_SCALED_FOUR_OVER_SIX) == 528
    assert {(c["four_over_six"], tuple(c["tile"]), c["scale_bound"]) for c in cases if not c["row_scaled"]} == {
        (m, t, b) for m in ("mae", "mse") for t in ((1, 16), (16, 16)) for b in (256, 448)
    }
    assert {c["kind"] for c in cases} >= {"grid46", "grid4", "zero_rows", "zeros", "outliers"}
    assert any(c["ragged"] for c in cases) and {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    picks = sum(int(tensors[f"{c['name']}/rowwise_pick_map4"].sum()) for c in cases if c["four_over_six"])
    assert picks > 1000


def test_four_over_six_is_not_plain_nvfp4():
    """The two candidates really compete: on a normal tensor some block takes map-to-4, whose scale
    is larger than plain NVFP4's, and the error it keeps is no larger than map-to-6's."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    plain = nvfp4.quantize(x)
    ours = nvfp4.quantize(x, four_over_six="mae", scale_bound=448)
    assert not torch.equal(plain.scales.view(torch.uint8), ours.scales.view(torch.uint8))
    err = lambda q: (q.dequantize() - x).abs().sum()  # noqa: E731
    assert err(ours) < err(plain)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"four_over_six": "max"}, "four_over_six='max' is not supported; allowed: (None, 'mae', 'mse')"),
        ({"four_over_six": "mae", "scale_bound": 300}, "scale_bound=300 is not supported; allowed: (448, 256)"),
        ({"scale_bound": 256}, "scale_bound=256 needs four_over_six"),
        ({"row_scaled": True, "tile": (16, 16)}, "row_scaled=True needs tile (1, 16)"),
        ({"four_over_six": "mse", "rounding": "sr"}, "four_over_six needs rounding='rne'"),
        ({"row_scaled": True, "rounding": "sr"}, "row_scaled needs rounding='rne'"),
    ],
)
def test_bad_option_combinations_are_refused_in_one_line(kwargs, message):
    x = torch.randn(32, 32)
    for fn in (nvfp4.quantize, nvfp4.fake_quantize):
        with pytest.raises(ValueError, match="^nvfp4") as info:
            fn(x, **kwargs)
        assert message in str(info.value) and "\n" not in str(info.value)
