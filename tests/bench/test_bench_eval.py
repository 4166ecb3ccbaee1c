"""benchmarks/bench_eval.py times an in-training evaluation per precision on CPU and merges its rows into the JSON
(a re-run replaces them)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_eval

ARGS = ["--device", "cpu", "--model", "hybrid_0p5m", "--seq", "32", "--sequences", "2", "--micro-batch", "2"]


def test_one_row_per_precision_and_eval_precision_and_a_rerun_replaces_them(tmp_path, capsys):
    out = tmp_path / "eval.json"
    out.write_text(json.dumps([{"model": "other", "precision": "bf16", "eval_s": 1.0}]))
    args = [*ARGS, "--precisions", "bf16", "nvfp4", "--eval-precision", "train", "both", "--repeats", "1"]
    args += ["--out", str(out)]
    bench_eval.main(args)
    bench_eval.main(args)
    rows = json.loads(out.read_text())
    ours = [r for r in rows if r["model"] == "hybrid_0p5m"]
    assert len(rows) == 5 and len(ours) == 4  # the unrelated row is kept, ours are replaced
    assert sorted((r["precision"], r["eval_precision"]) for r in ours) == [
        ("bf16", "both"),
        ("bf16", "train"),
        ("nvfp4", "both"),
        ("nvfp4", "train"),
    ]
    for r in ours:
        assert set(r) == {*bench_eval.KEY, "backend", "eval_s", "tokens_per_s", "commit"}
        assert r["gpu"] == "cpu" and r["backend"] == "emulated" and r["eval_s"] > 0 and r["tokens_per_s"] > 0
        assert (r["seq"], r["sequences"], r["sources"], r["micro_batch"]) == (32, 2, 2, 2)
    assert "nvfp4            both" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--repeats", "0"], ["--precisions", "fp3"], ["--model", "nope"]])
def test_bad_arguments_exit_2(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_eval.main([*ARGS, *bad, "--out", str(tmp_path / "eval.json")])
    assert exit_info.value.code == 2 and "error:" in capsys.readouterr().err
    assert not (tmp_path / "eval.json").exists()
