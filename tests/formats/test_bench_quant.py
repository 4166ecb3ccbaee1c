"""scripts/bench_quant.py runs on CPU and merges its rows into the JSON (a re-run replaces them)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_quant.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_quant", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_run_writes_one_row_per_quantizer_shape_impl_and_rerun_replaces(tmp_path, capsys):
    bench = load_script()
    out = tmp_path / "quant.json"
    out.write_text(json.dumps([{"quantizer": "other", "shape": "1x1", "impl": "reference", "ms": 1.0}]))
    args = ["--device", "cpu", "--shapes", "128x128", "--impls", "reference", "--repeats", "1", "--out", str(out)]
    bench.main(args)
    first = json.loads(out.read_text())
    bench.main(args)
    rows = json.loads(out.read_text())
    n_cases = len(bench.cases(None))
    assert len(first) == len(rows) == n_cases + 1  # the unrelated row is kept, ours are replaced
    ours = [r for r in rows if r["shape"] == "128x128"]
    assert {r["quantizer"] for r in ours} == {name for name, _ in bench.cases(None)}
    for r in ours:
        assert set(r) == {"quantizer", "shape", "impl", "ms", "gbps", "copy_gbps", "frac_of_copy", "gpu", "commit"}
        assert r["impl"] == "reference" and r["gpu"] == "cpu" and r["ms"] > 0 and r["gbps"] > 0
    assert "nvfp4.quantize 1x16 rne" in capsys.readouterr().out
