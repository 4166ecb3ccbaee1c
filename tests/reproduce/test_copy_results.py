"""`reproduce copy-results`: a finished run's results (no checkpoints) copied for committing, metrics gzipped and
read back the same by `report` and `compare`; never overwriting; replicates compared in the report."""

from __future__ import annotations

import gzip
import json
import sys

from nvfp4train.compare.runs import load_local
from nvfp4train.reproduce import report
from nvfp4train.reproduce.experiments import load_experiment
from nvfp4train.reproduce.plan import copy_results, plan_experiment
from tests.reproduce.test_stats import EXPERIMENT, write_run


def planned(tmp_path, runs_dir):
    experiments = tmp_path / "experiments"
    experiments.mkdir(exist_ok=True)
    (experiments / "synth.yaml").write_text(EXPERIMENT)
    return experiments, plan_experiment(load_experiment("synth", experiments), runs_dir)


def test_copy_results_gzips_metrics_reads_back_the_same_and_never_overwrites(tmp_path):
    runs_dir, results = tmp_path / "runs", tmp_path / "results"
    for seed in (1, 2, 3):
        write_run(runs_dir, "fp8_blockwise", seed, 0.0)
        write_run(runs_dir, "nvfp4", seed, 0.4)
    (runs_dir / "synth" / "nvfp4" / "seed1" / "checkpoints").mkdir()
    (runs_dir / "synth" / "nvfp4" / "seed2" / "run.json").write_text(json.dumps({"state": "failed", "train_rc": 1}))
    experiments, runs = planned(tmp_path, runs_dir)
    said = {run.key: copy_results(run, results) for run in runs}
    assert said["synth/nvfp4/seed2"] == "skipped (failed)"
    dest = results / "synth" / "nvfp4" / "seed1"
    assert said["synth/nvfp4/seed1"] == f"copied into {dest}"
    assert sorted(p.name for p in dest.iterdir()) == ["config.yaml", "eval.json", "metrics.jsonl.gz", "run.json"]
    original = (runs_dir / "synth" / "nvfp4" / "seed1" / "metrics.jsonl").read_bytes()
    assert gzip.decompress((dest / "metrics.jsonl.gz").read_bytes()) == original
    # report and compare read the gzipped copy as the original
    from_runs, from_results = report.load_runs([runs_dir]), report.load_runs([results])
    assert from_results[("synth", "nvfp4", 1)].train == from_runs[("synth", "nvfp4", 1)].train
    assert ("synth", "nvfp4", 2) not in from_results
    assert load_local(dest).records == load_local(runs_dir / "synth" / "nvfp4" / "seed1").records
    # a second copy leaves what is there alone, even if the run changed since
    (dest / "eval.json").write_text('{"kept": true}')
    assert all(copy_results(run, results).startswith(("already in", "skipped")) for run in runs)
    assert json.loads((dest / "eval.json").read_text()) == {"kept": True}
    assert not list(results.rglob("*.partial"))


def test_replicates_section_says_whether_runs_repeat(tmp_path):
    runs_dir, out = tmp_path / "runs", tmp_path / "out"
    for seed in (1, 2):
        write_run(runs_dir, "fp8_blockwise", seed, 0.0)
        write_run(runs_dir, "nvfp4", seed, 0.4)
    write_run(out / "replicates" / "batch2", "fp8_blockwise", 1, 0.0)  # the same run again: equal
    write_run(out / "replicates" / "batch2", "nvfp4", 2, 0.41)  # a run that did not repeat
    write_run(out / "replicates" / "batch3", "nvfp4", 2, 0.4)  # and again in another batch: equal
    experiments, _ = planned(tmp_path, runs_dir)
    text = report.write_report([runs_dir], out, experiments, figures=False).read_text()
    section = text.split("## Replicates")[1].split("\n## ")[0]
    same = next(line for line in section.splitlines() if line.startswith("| synth/fp8_blockwise/1 | batch2 "))
    assert "identical at all 50" in same and same.endswith("| identical |")
    other = next(line for line in section.splitlines() if line.startswith("| synth/nvfp4/2 | batch2 "))
    assert "50 of 50 differ" in other and "+0.0100%" in other
    again = next(line for line in section.splitlines() if line.startswith("| synth/nvfp4/2 | batch3 "))
    assert "identical at all 50" in again


def test_setup_line_says_where_the_data_starts_repeating(tmp_path):
    runs_dir = tmp_path / "runs"
    for arm in ("fp8_blockwise", "nvfp4"):
        write_run(runs_dir, arm, 1, 0.0)
        path = runs_dir / "synth" / arm / "seed1" / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:  # one source passes over its data once by step 20 (2,000 of 5,000 tokens)
            r["data/epochs/books"] = r["step"] / 20
        path.write_text("\n".join(map(json.dumps, records)) + "\n")
    experiments, _ = planned(tmp_path, runs_dir)
    exp = load_experiment("synth", experiments)
    line = report.setup_line(exp, report.load_runs([runs_dir]))
    assert "starts repeating (a source's second pass) at 0.0M tokens, 40% of the run" in line, line
    assert "(1 seed)" in line


def test_copy_results_refuses_a_link_in_a_run_and_copies_the_others(tmp_path):
    from nvfp4train.launch.processes import run_and_kill_on_timeout
    from tests.conftest import REPO, cli_env

    runs_dir, results = tmp_path / "runs", tmp_path / "results"
    for seed in (1, 2, 3):
        write_run(runs_dir, "nvfp4", seed, 0.4)
        write_run(runs_dir, "fp8_blockwise", seed, 0.0)
    secret = tmp_path / "secret.txt"
    secret.write_text("a token that must never be committed\n")
    linked = runs_dir / "synth" / "nvfp4" / "seed1" / "eval.json"
    linked.unlink()
    linked.symlink_to(secret)
    experiments, _ = planned(tmp_path, runs_dir)
    cmd = [sys.executable, "-m", "nvfp4train.reproduce", "--experiments-dir", str(experiments), "copy-results"]
    cmd += ["synth", "--runs-dir", str(runs_dir), "--to", str(results)]
    proc = run_and_kill_on_timeout(cmd, cwd=REPO, env=cli_env(), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: synth/nvfp4/seed1: {linked} is a symbolic link (to {secret}); copy-results copies a run's own "
        "files only: not copied"
    ]
    assert not (results / "synth" / "nvfp4" / "seed1").exists() and not list(results.rglob("*.partial"))
    assert (results / "synth" / "nvfp4" / "seed2" / "eval.json").is_file()  # the other runs are copied
    assert not any(secret.read_text() in p.read_text(errors="replace") for p in results.rglob("*.json"))


def test_copy_results_removes_only_a_partial_directory_of_its_own(tmp_path):
    import pytest

    from nvfp4train.reproduce.experiments import UsageError
    from nvfp4train.reproduce.plan import PARTIAL_MARKER

    runs_dir, results = tmp_path / "runs", tmp_path / "results"
    write_run(runs_dir, "nvfp4", 1, 0.4)
    _, runs = planned(tmp_path, runs_dir)
    run = next(r for r in runs if r.key == "synth/nvfp4/seed1")
    partial = results / "synth" / "nvfp4" / "seed1.partial"
    partial.mkdir(parents=True)
    (partial / "notes.md").write_text("mine")
    with pytest.raises(UsageError, match=r"seed1\.partial is in the way and was not made by copy-results"):
        copy_results(run, results)
    assert (partial / "notes.md").read_text() == "mine"
    # one that copy-results left (an interrupted copy) is its own: removed and made again
    (partial / "notes.md").unlink()
    (partial / PARTIAL_MARKER).write_text("")
    (partial / "half.gz").write_bytes(b"\x1f")
    assert copy_results(run, results).startswith("copied into")
    dest = results / "synth" / "nvfp4" / "seed1"
    assert sorted(p.name for p in dest.iterdir()) == ["config.yaml", "eval.json", "metrics.jsonl.gz", "run.json"]
    assert not partial.exists()
