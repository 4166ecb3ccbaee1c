"""Hydra's own flags pass through the up-front override check, and a sweep writes nothing into the cwd."""

import subprocess
import sys

from tests.conftest import cli_env


def test_cfg_job_prints_the_composed_config(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "--cfg", "job", "precision=nvfp4"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "name: nvfp4" in proc.stdout and "micro_batch_size: null" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_multirun_leaves_no_multirun_yaml_in_the_cwd(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            "-m",
            "seed=1,2",
            f"out_dir={out}/s${{seed}}",
            "train.max_steps=1",
            "train.seq_len=32",
            "train.global_batch_size=2",
            "train.eval_sequences=1",
            "train.progress=false",
        ],
        cwd=tmp_path,
        env=cli_env(TMPDIR=tmp_path / "tmp"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tmp"]
    assert sorted(p.name for p in out.iterdir()) == ["s1", "s2"]
