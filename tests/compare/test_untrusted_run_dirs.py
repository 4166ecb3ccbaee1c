"""`python -m nvfp4train.compare` on run directories crafted to hurt the reader (nvfp4train/runs.py): an alias
bomb, an endless gzip line, a FIFO, /dev/zero, lone surrogates, deep nesting, sections of the wrong type.
Each ends in one line (or, for a damaged metrics line, one warning) within seconds, never a traceback."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from nvfp4train import runs
from tests.conftest import REPO, cli_env

RECORD = REPO / "docs" / "results" / "runs" / "fp8_vs_nvfp4" / "nvfp4" / "seed1"  # a committed run: no training


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RECORD, d)
    return d


def compare(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI; the timeout stands for "never hangs" (a FIFO waited on, an expansion of gigabytes)."""
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.compare", *map(str, args), "--no-plots"],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def quickly_refused(read, *args) -> str:
    """The reader itself, in this process: refused within seconds (the CLI adds its start-up)."""
    started = time.monotonic()
    with pytest.raises(runs.RunError) as refusal:
        read(*args)
    assert time.monotonic() - started < 10
    return str(refusal.value)


def refused(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (proc.returncode, lines)
    return lines[0]


def test_a_yaml_alias_bomb_is_refused_before_it_expands(run_dir, tmp_path):
    levels = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):  # 9 levels of 9 aliases: 9**9 (387 million) values once expanded
        levels.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    original = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(original + "\n".join(levels) + "\n")
    proc = compare(run_dir, "--out", tmp_path / "out")
    line = refused(proc)
    assert f"{run_dir / 'config.yaml'}: expands to more than 100,000 values" in line, line
    assert not (tmp_path / "out").exists()
    assert "expands to more than" in quickly_refused(runs.read_config, run_dir)


def test_an_oversized_config_is_refused_unread(run_dir, tmp_path):
    with open(run_dir / "config.yaml", "a") as f:
        f.write("# " + "x" * runs.MAX_CONFIG_BYTES + "\n")
    assert "config.yaml: larger than 1,048,576 bytes" in refused(compare(run_dir, "--out", tmp_path / "out"))


def test_a_gzip_of_one_endless_line_stops_at_the_line_cap(run_dir, tmp_path):
    line = b'{"step": 1, "loss": 2.0, "pad": "' + b"x" * (2 * runs.MAX_METRICS_LINE_BYTES) + b'"}\n'
    with gzip.open(run_dir / "metrics.jsonl.gz", "wb") as f:  # 2 MiB, compressed to a few KB
        f.write(line)
    proc = compare(run_dir, "--out", tmp_path / "out")
    assert f"{run_dir / 'metrics.jsonl.gz'}: line 1 is longer than 1,048,576 bytes" in refused(proc)
    assert "line 1 is longer than" in quickly_refused(runs.read_metrics, run_dir)


def test_a_damaged_gzip_is_one_line(run_dir, tmp_path):
    data = (run_dir / "metrics.jsonl.gz").read_bytes()
    (run_dir / "metrics.jsonl.gz").write_bytes(data[: len(data) // 2])  # cut in the middle of the stream
    assert "metrics.jsonl.gz: unreadable" in refused(compare(run_dir, "--out", tmp_path / "out"))


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
def test_metrics_that_is_no_regular_file_is_refused_without_waiting(run_dir, tmp_path, kind):
    metrics = run_dir / "metrics.jsonl"
    if kind == "fifo":
        os.mkfifo(metrics)  # no writer ever comes: opening it for reading must not wait for one
    elif kind == "dev_zero":
        metrics.symlink_to("/dev/zero")  # endless zeros: reading it whole would fill memory
    else:
        metrics.mkdir()
    proc = compare(run_dir, "--out", tmp_path / "out")
    what = {"fifo": "a FIFO", "dev_zero": "a character device", "directory": "a directory"}[kind]
    assert f"{metrics}: is {what}; a run directory's files must be regular files" in refused(proc)
    assert what in quickly_refused(runs.read_metrics, run_dir)


def test_a_lone_surrogate_or_deep_nesting_is_a_damaged_line(run_dir, tmp_path):
    with gzip.open(run_dir / "metrics.jsonl.gz", "rt") as f:
        lines = f.read().splitlines()
    lines.insert(2, '{"step": 3, "loss": 1.0, "\\ud800": 1.0}')  # a key no file can be written with
    lines.insert(4, '{"step": 4, "precision_switch": "\\udfff"}')
    lines.insert(6, "[" * 100_000 + "]" * 100_000)  # deeper than Python's recursion limit
    (run_dir / "metrics.jsonl.gz").unlink()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    proc = compare(run_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr
    warning = proc.stderr.strip().splitlines()
    metrics = run_dir / "metrics.jsonl"
    assert warning == [f"warning: 3 damaged metrics line(s) skipped: {metrics}:3, {metrics}:5, {metrics}:7"]
    json.loads((out / "compare.json").read_text())  # written whole, in UTF-8
    (out / "compare.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("section", ["train", "data", "optim", "precision"])
def test_a_section_of_the_wrong_type_is_one_line_even_with_allow_mismatch(run_dir, tmp_path, section):
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config[section] = [1, 2]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    proc = compare(RECORD, run_dir, "--allow-mismatch", "--out", tmp_path / "out")
    assert f"{run_dir / 'config.yaml'}: `{section}` is a list, not a mapping" in refused(proc)


def test_an_eval_json_with_nan_is_one_line(run_dir, tmp_path):
    evaluation = json.loads((run_dir / "eval.json").read_text())
    source = next(iter(evaluation["heldout"]))
    evaluation["heldout"][source]["loss"] = float("nan")
    (run_dir / "eval.json").write_text(json.dumps(evaluation))  # json writes the NaN literal
    line = refused(compare(run_dir, "--out", tmp_path / "out"))
    assert f"{run_dir / 'eval.json'}: heldout.{source} has no finite `loss`" in line
