"""benchmarks/bench_quant.py runs on CPU and merges its rows into the JSON (a re-run replaces them)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_quant
from tests.bench import run_benchmark


def test_cpu_run_writes_one_row_per_quantizer_shape_impl_and_rerun_replaces(tmp_path, capsys):
    bench = bench_quant
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


def test_rht_blocks_sweep_times_the_fused_wgrad_kernels_one_row_per_block_shape(tmp_path):
    """--rht-blocks: nvfp4 and mxfp4 rht_quantize_t at each block shape, Triton only (here in the
    interpreter: a subprocess, since TRITON_INTERPRET must be set before triton is imported)."""
    pytest.importorskip("triton")
    out = tmp_path / "quant.json"
    run = run_benchmark(
        "bench_quant", "--shapes", "128x128", "--rht-blocks", "2,64", "2,64,4", "--repeats", "1", "--out", out
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert sorted(r["quantizer"] for r in rows) == sorted(
        f"{fmt}.rht_quantize_t {tile} {rounding} {blocks}"
        for fmt, tile in (("nvfp4", "1x16"), ("mxfp4", "1x32"))
        for rounding in ("rne", "sr")
        for blocks in ("blocks=2x64", "blocks=2x64 warps=4")
    )
    assert all(r["impl"] == "triton" and r["ms"] > 0 for r in rows)


def test_weight_pair_times_one_pass_against_two_calls_on_the_given_dtype(tmp_path):
    """--weight-pair: a 4over6 weight's W and Wt from quantize_tiles_rowcol and from two separate calls, dense and
    packed, on an FP32 tensor (training's master weight), the shape labelled with its dtype."""
    out = tmp_path / "quant.json"
    args = ["--device", "cpu", "--shapes", "128x128", "--impls", "reference", "--repeats", "1", "--out", str(out)]
    bench_quant.main([*args, "--weight-pair", "--dtype", "float32"])
    rows = json.loads(out.read_text())
    assert sorted(r["quantizer"] for r in rows) == sorted(name for name, _ in bench_quant.weight_pair_cases())
    assert len(rows) == 4 and all(r["shape"] == "128x128 float32" and r["ms"] > 0 for r in rows)
    assert {name for name, _ in bench_quant.weight_pair_cases()[:2]} <= {name for name, _ in bench_quant.cases(None)}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rht-blocks", "4,64", "--weight-pair"], "give one of them"),
        (["--rht-blocks", "3,64"], "power of two"),
        (["--rht-blocks", "4,64,3"], "power of two"),
        (["--rht-blocks", "4x64"], "GROUPS,FEATURES"),
        (["--rht-blocks", "4,64,8,2"], "GROUPS,FEATURES"),
        (["--rht-blocks", "4,64", "--impls", "reference"], "must include triton"),
    ],
)
def test_bad_rht_blocks_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_quant.main(["--device", "cpu", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_merge_keeps_each_gpu_models_rows(tmp_path):
    out = tmp_path / "quant.json"
    row = {"quantizer": "nvfp4 1x16 rne", "shape": "16384x4096", "impl": "triton", "ms": 0.3}
    bench_quant.merge(out, [{**row, "gpu": "NVIDIA H100 80GB HBM3"}])
    bench_quant.merge(out, [{**row, "gpu": "NVIDIA H200", "ms": 0.25}])
    bench_quant.merge(out, [{**row, "gpu": "NVIDIA H200", "ms": 0.24}])  # a re-run on the same GPU replaces
    rows = json.loads(out.read_text())
    assert sorted((r["gpu"], r["ms"]) for r in rows) == [("NVIDIA H100 80GB HBM3", 0.3), ("NVIDIA H200", 0.24)]
