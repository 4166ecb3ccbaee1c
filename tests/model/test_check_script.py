import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_script_runs_its_cpu_dry_run():
    # The GPU check can only run on a GPU machine; its CPU dry run (torch vs torch) keeps the
    # script itself from rotting: all rows must be printed and agree exactly.
    result = subprocess.run([sys.executable, "scripts/check_ssd_gpu.py", "--cpu-dry-run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "22/22 within tolerance" in result.stdout


def test_gpu_check_script_without_cuda_exits_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    result = subprocess.run([sys.executable, "scripts/check_ssd_gpu.py"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "no CUDA" in result.stdout
