"""The model's compile marks (model/marks.py) are torch's own, and importing the model does not import
torch._dynamo (torch.compile's machinery, which --help does not need)."""

from __future__ import annotations

import subprocess
import sys

import torch

from nvfp4train.model.marks import assume_constant_result
from tests.conftest import REPO, cli_env


def test_assume_constant_result_marks_as_torch_does():
    def ours():
        return 1

    def torchs():
        return 1

    assert assume_constant_result(ours) is ours
    assert torch.compiler.assume_constant_result(torchs) is torchs
    assert vars(ours) == vars(torchs) and vars(ours)


def test_a_marked_function_is_a_constant_under_compile():
    calls = []

    @assume_constant_result
    def flag() -> bool:
        calls.append(1)
        return True

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        return x + 1 if flag() else x - 1

    assert f(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert f(torch.zeros(2)).tolist() == [1.0, 1.0] and len(calls) == 1  # called once, while tracing


def test_importing_the_model_does_not_import_dynamo():
    code = (
        "import sys, nvfp4train.model, nvfp4train.model.hybrid, nvfp4train.model.ssd, nvfp4train.model.mixer_op\n"
        "from nvfp4train.model import HybridLM\n"
        "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo imported'\n"
        "from nvfp4train.model import ops\n"
        "ext = ops.causal_conv1d_extension\n"  # made on first use, as torch.compiler.disable makes it
        "assert getattr(ext, '_torchdynamo_disable', False), vars(ext)\n"
        "assert ops.causal_conv1d_extension is ext\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
