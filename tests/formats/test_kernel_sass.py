"""nvfp4train.formats.kernels.sm90 compiles our Triton kernels for sm_90a on a machine without a GPU and counts
their machine instructions per element."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # compiles Triton kernels for sm_90a and disassembles them: not the quick loop


def test_counts_instructions_per_element_of_each_variant(capsys):
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm").exists():
        pytest.skip("this triton has no nvdisasm")
    from nvfp4train.formats.kernels import sm90

    rows = {r["kernel"]: r for r in sm90.main(["--kernels", "rht_rne_packed", "rht_rowwise_rne"])}
    assert set(rows) == {"rht_rne_packed", "rht_rowwise_rne"}
    # the same tile quantized a second time (1x16 along features) costs instructions on top
    assert 0 < rows["rht_rne_packed"]["per_element"] < rows["rht_rowwise_rne"]["per_element"]
    assert rows["rht_rne_packed"]["sass"] > 16 * 32  # at least the 16-point transform's multiply-adds
    assert "rht_rowwise_rne" in capsys.readouterr().out


def test_a_4over6_weights_two_copies_cost_less_than_two_quantizations():
    """The one-pass W + Wt kernel (quantize_tiles_rowcol) issues fewer instructions per element than the two
    16x16 4over6 quantizations it replaces: a static proxy of its speed where no GPU is at hand (sm90.py)."""
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm").exists():
        pytest.skip("this triton has no nvdisasm")
    from nvfp4train.formats.kernels import sm90

    rows = {r["kernel"]: r for r in sm90.main(["--kernels", "nvfp4_te_16x16", "nvfp4_4over6_rowcol"])}
    assert rows["nvfp4_te_16x16"]["per_element"] < rows["nvfp4_4over6_rowcol"]["per_element"]
    assert rows["nvfp4_4over6_rowcol"]["per_element"] < 2 * rows["nvfp4_te_16x16"]["per_element"]
