"""GPU checks (skipped without CUDA): the table of scripts/check_precision_gpu.py, as tests."""
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "check_precision_gpu.py"
    spec = importlib.util.spec_from_file_location("check_precision_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("check", ["check_cuda_equals_cpu", "check_emulated_gemm_exact", "check_scaled_mm",
                                   "check_auto_picks_scaled_mm", "check_compiled_equals_eager", "check_te"])
def test_gpu_check(check):
    rows = []
    getattr(_script(), check)(rows)
    bad = [row for row in rows if not row[4]]
    assert rows and not bad, bad
