"""scripts/check_precision_gpu.py without a GPU: one clear line and exit 2 (its checks run as tests
in test_gpu.py on a GPU machine)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_script_without_cuda_exits_2():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    result = subprocess.run([sys.executable, "scripts/check_precision_gpu.py"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "no CUDA GPU" in result.stdout, result.stdout + result.stderr
