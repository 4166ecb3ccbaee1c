"""scripts/kernel_sass.py compiles our Triton kernels for sm_90a on a machine without a GPU and counts their
machine instructions per element."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kernel_sass.py"


def test_counts_instructions_per_element_of_each_variant(capsys):
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm").exists():
        pytest.skip("this triton has no nvdisasm")
    spec = importlib.util.spec_from_file_location("kernel_sass", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    rows = {r["kernel"]: r for r in module.main(["--kernels", "rht_rne_packed", "rht_rowwise_rne"])}
    assert set(rows) == {"rht_rne_packed", "rht_rowwise_rne"}
    # the same tile quantized a second time (1x16 along features) costs instructions on top
    assert 0 < rows["rht_rne_packed"]["per_element"] < rows["rht_rowwise_rne"]["per_element"]
    assert rows["rht_rne_packed"]["sass"] > 16 * 32  # at least the 16-point transform's multiply-adds
    assert "rht_rowwise_rne" in capsys.readouterr().out
