"""`python -m nvfp4train.eval` on a run whose config.yaml lacks a section it reads (or holds one of the wrong
type): one line naming the file and the section, before a checkpoint is loaded, and no eval.json."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, cli_env


def broken_copy(tiny_run, tmp_path, change):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval.json"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    change(config)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


CASES = {
    "no data": (lambda c: c.pop("data"), "has no `data` section"),
    "no train": (lambda c: c.pop("train"), "has no `train` section"),
    "no seq_len": (lambda c: c["train"].pop("seq_len"), "`train` has no `seq_len`"),
    "no tokenizer": (lambda c: c["data"].pop("tokenizer"), "`data` has no `tokenizer`"),
    "train a list": (lambda c: c.update(train=[1, 2]), "`train` is a list, not a mapping"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_missing_section_is_one_line(tiny_run, tmp_path, capsys, case):
    from nvfp4train.eval.__main__ import main

    change, needle = CASES[case]
    run = broken_copy(tiny_run, tmp_path, change)
    assert main([f"run_dir={run}", "tasks=arithmetic", "max_items=2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"error: {run / 'config.yaml'}: ") and needle in lines[0]
    assert not (run / "eval.json").exists()


def test_the_cli_names_the_missing_section_without_a_traceback(tiny_run, tmp_path):
    run = broken_copy(tiny_run, tmp_path, lambda c: c.pop("data"))
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.eval", f"run_dir={run}"],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {run / 'config.yaml'}: has no `data` section; not a complete training run's config"
    ]
    assert not (run / "eval.json").exists()
