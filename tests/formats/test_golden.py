"""Bit-exactness against Transformer Engine's reference quantizer (golden/te_nvfp4_reference/).

Every code byte, every scale byte and the amax must match: rowwise (x), columnwise (x.T) and
columnwise after the 16-point RHT, for 1x16 and 16x16 tiles, fp32 and bf16 inputs; MXFP4 with the
paper's round-up scale rule.
"""

from __future__ import annotations

import pytest
import torch

from nvfp4train.formats import hadamard, mxfp4, nvfp4

from .conftest import golden_manifest


def _case_names(fmt: str) -> list[str]:
    return [c["name"] for c in golden_manifest()["cases"] if c["format"] == fmt]


def _case(golden, name):
    manifest, tensors = golden
    meta = next(c for c in manifest["cases"] if c["name"] == name)
    return meta, {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(name + "/")}


def _assert_same_bits(q: nvfp4.NVFP4Tensor, fields: dict, which: str, meta: dict) -> None:
    where = f"{meta['name']} ({meta['kind']}, {meta['dtype']}, tile {meta['tile']}, rht={meta['rht_on_columnwise']})"
    where += f" {which}"
    want_scales = fields[f"{which}_scales_e4m3"]
    got_scales = q.scales.view(torch.uint8)
    assert torch.equal(got_scales, want_scales), f"{where}: {(got_scales != want_scales).sum()} scale bytes differ"
    want_codes = fields[f"{which}_codes"]
    assert torch.equal(q.codes, want_codes), f"{where}: {(q.codes != want_codes).sum()} code bytes differ"
    assert torch.equal(q.amax.reshape(1), fields[f"amax_{which}"]), f"{where}: amax differs"


@pytest.mark.parametrize("name", _case_names("nvfp4"))
def test_nvfp4_matches_te_reference(golden, name):
    meta, fields = _case(golden, name)
    x, tile = fields["x"], tuple(meta["tile"])
    assert x.dtype == getattr(torch, meta["dtype"])
    _assert_same_bits(nvfp4.quantize(x, tile=tile), fields, "rowwise", meta)
    columnwise_input = x.t()
    if meta["rht_on_columnwise"]:
        columnwise_input = hadamard.rht(columnwise_input, d=16)
    _assert_same_bits(nvfp4.quantize(columnwise_input, tile=tile), fields, "columnwise", meta)


@pytest.mark.parametrize("name", _case_names("mxfp4"))
def test_mxfp4_matches_te_reference(golden, name):
    meta, fields = _case(golden, name)
    q = mxfp4.quantize(fields["x"], rounding="rne", scale_rule="rceil")
    want = fields["rowwise_scales_fp32"]
    assert torch.equal(q.scales.to(torch.float32), want), f"{name} ({meta['kind']}): scales differ"
    assert torch.equal(q.codes, fields["rowwise_codes"]), f"{name} ({meta['kind']}): codes differ"


def test_rht16_matrix_matches_te_reference(golden):
    _, tensors = golden
    assert torch.equal(hadamard.rht_matrix(16, dtype=torch.float32), tensors["rht16_matrix"].to(torch.float32))


def test_golden_covers_what_it_claims(golden):
    """Guards the oracle itself: the case mix the tests above rely on is really there."""
    manifest, _ = golden
    cases = manifest["cases"]
    nv = [c for c in cases if c["format"] == "nvfp4"]
    assert {tuple(c["tile"]) for c in nv} == {(1, 16), (16, 16)}
    assert {c["dtype"] for c in nv} == {"float32", "bfloat16"}
    assert any(c["rht_on_columnwise"] for c in nv)
    assert {"grid", "wide_range", "zeros", "zero_blocks", "outliers"} <= {c["kind"] for c in cases}
    assert any(c["format"] == "mxfp4" for c in cases)
