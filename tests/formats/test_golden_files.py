"""The golden vectors are part of the repository, and their manifest describes the tensor file."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from .conftest import GOLDEN_4OVER6_DIR, GOLDEN_DIR, golden_4over6_manifest, golden_manifest

FIELDS = {
    "nvfp4": {
        "x",
        "rowwise_codes",
        "rowwise_scales_e4m3",
        "columnwise_codes",
        "columnwise_scales_e4m3",
        "amax_rowwise",
        "amax_columnwise",
    },
    "mxfp4": {"x", "rowwise_codes", "rowwise_scales_fp32"},
}


def test_golden_vectors_are_committed_with_the_tests():
    assert GOLDEN_DIR == Path(__file__).resolve().parent / "golden" / "te_nvfp4_reference"
    for name in ("README.md", "manifest.json", "cases.safetensors"):
        assert (GOLDEN_DIR / name).is_file(), f"{GOLDEN_DIR / name} is missing from the checkout"
    readme = (GOLDEN_DIR / "README.md").read_text()
    assert golden_manifest()["te_commit"] in readme and "Apache" in readme  # provenance and licence


def test_manifest_and_tensor_file_hold_the_same_cases():
    cases = golden_manifest()["cases"]
    assert len(cases) == 216 and len({c["name"] for c in cases}) == len(cases)
    want = {"rht16_matrix"} | {f"{c['name']}/{field}" for c in cases for field in FIELDS[c["format"]]}
    with safe_open(str(GOLDEN_DIR / "cases.safetensors"), framework="pt") as f:
        assert set(f.keys()) == want
        for c in cases:
            x = f.get_slice(f"{c['name']}/x")
            assert x.get_shape() == c["shape"], c["name"]
            assert x.get_dtype() == {"float32": "F32", "bfloat16": "BF16"}[c["dtype"]], c["name"]


def test_4over6_golden_vectors_are_committed_and_match_their_manifest():
    for name in ("README.md", "manifest.json", "cases.safetensors"):
        assert (GOLDEN_4OVER6_DIR / name).is_file(), f"{GOLDEN_4OVER6_DIR / name} is missing from the checkout"
    manifest = golden_4over6_manifest()
    readme = (GOLDEN_4OVER6_DIR / "README.md").read_text()
    assert manifest["te_commit"] in readme and "Apache" in readme
    with safe_open(str(GOLDEN_4OVER6_DIR / "cases.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for c in manifest["cases"]:
            assert f.get_slice(f"x/{c['x']}").get_shape() == c["shape"], c["name"]
            sides = ("rowwise", "columnwise") if c["columnwise"] else ("rowwise",)
            for side in sides:
                for field in ("codes", "scales_e4m3", "amax", "global_decode_scale"):
                    assert f"{c['name']}/{side}_{field}" in keys, (c["name"], side, field)
            assert f"{c['name']}/rowwise_dequant" in keys
