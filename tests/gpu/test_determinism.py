"""Deterministic mode on a GPU (skipped without CUDA): each kernel the flag selects gives the same bits when
called twice, mamba-ssm's SSD kernels are pinned to one configuration, and whole runs repeat bit for bit
(scripts/check_determinism_gpu.py, on two GPUs at once when there are two).

    python -m pytest -q tests/gpu/test_determinism.py
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

# cuBLAS reads its workspace setting once, when this process first uses it: set before any test runs
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from nvfp4train.launch.processes import run_and_kill_on_timeout
from nvfp4train.model import PLAIN_LAYERS, blocks, ops, ssd
from nvfp4train.train.determinism import deterministic_mode
from tests.conftest import REPO, cli_env

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _twice(fn, *inputs):
    """fn's output and its inputs' gradients, computed twice from the same inputs."""
    results = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        out = fn(*leaves)
        out.backward(torch.ones_like(out) / out.numel() ** 0.5)
        results.append([out.detach()] + [t.grad for t in leaves if t.grad is not None])
    return results


def _assert_bitwise(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()


def _ssd_inputs(b=4, T=1024, h=16, p=64, g=4, n=64):
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    return (
        torch.randn(b, T, h, p, device=cuda, dtype=torch.bfloat16),
        torch.randn(b, T, h, device=cuda),
        -torch.rand(h, device=cuda) * 8 - 1,
        torch.randn(b, T, g, n, device=cuda, dtype=torch.bfloat16),
        torch.randn(b, T, g, n, device=cuda, dtype=torch.bfloat16),
        torch.randn(h, device=cuda),
        torch.randn(h, device=cuda),
    )


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_the_ssd_repeats_bitwise_in_deterministic_mode(backend):
    if backend == "auto" and not ops.triton_ssd_deterministic_mode():
        pytest.skip("mamba-ssm >= 2.3 (its Triton kernels with a deterministic mode) is not installed")
    with deterministic_mode(True):
        first, second = _twice(lambda *t: ssd.ssd_scan(*t, chunk_size=128, backend=backend), *_ssd_inputs())
        _assert_bitwise(first, second)
        if backend == "auto":
            modules = [sys.modules[f"mamba_ssm.ops.triton.{m}"] for m in ops.SSD_TRITON_MODULES]
            from triton.runtime.autotuner import Autotuner

            tuners = [k for m in modules for k in vars(m).values() if isinstance(k, Autotuner)]
            assert tuners and all(len(k.configs) == 1 for k in tuners)
    if backend == "auto":  # given back at the first call outside the mode
        ssd.ssd_scan(*_ssd_inputs(b=1, T=256), chunk_size=128, backend=backend)
        assert any(len(k.configs) > 1 for k in tuners)


def test_the_deterministic_ssd_matches_the_pytorch_scan():
    if not ops.triton_ssd_deterministic_mode():
        pytest.skip("mamba-ssm >= 2.3 is not installed")
    inputs = [t.float() if t.dtype == torch.bfloat16 else t for t in _ssd_inputs(b=2, T=512)]
    with deterministic_mode(True):
        y_triton = ssd.ssd_scan(*inputs, chunk_size=128, backend="triton")
        y_torch = ssd.ssd_scan(*inputs, chunk_size=128, backend="torch")
    assert ((y_triton - y_torch).norm() / y_torch.norm()).item() < 5e-3


def test_the_triton_causal_conv_repeats_bitwise():
    from nvfp4train.model.causal_conv import causal_conv1d_silu_triton

    torch.manual_seed(0)
    x = torch.randn(8, 1024, 1280, device="cuda", dtype=torch.bfloat16)
    w, bias = torch.randn(1280, 1, 4, device="cuda"), torch.randn(1280, device="cuda")
    first, second = _twice(causal_conv1d_silu_triton, x, w, bias)
    _assert_bitwise(first, second)


def test_math_attention_repeats_bitwise():
    from nvfp4train.model.config import ModelConfig
    from tests.conftest import SMALL_MODEL as SMALL

    cfg = ModelConfig.from_dict({**SMALL, "d_model": 512, "n_heads": 8, "n_kv_heads": 2, "head_dim": 64})
    torch.manual_seed(0)
    attn = blocks.Attention(cfg, 1, PLAIN_LAYERS).cuda()
    x = torch.randn(8, 1024, 512, device="cuda")
    with deterministic_mode(True), torch.autocast("cuda", dtype=torch.bfloat16):
        first, second = _twice(attn, x)
    _assert_bitwise(first, second)


@pytest.mark.slow
def test_two_runs_are_bitwise_equal(tmp_path):
    """hybrid_tiny, BF16 and NVFP4 compiled with the CUDA graph, 30 steps each, run twice (at once on two GPUs)."""
    proc = run_and_kill_on_timeout(
        [
            sys.executable,
            "scripts/check_determinism_gpu.py",
            "--model",
            "hybrid_tiny",
            "--seq",
            "256",
            "--batch",
            "8",
            "--steps",
            "30",
            "--kill-at",
            "10",
            "--cases",
            "graph",
            "resume",
            "--deadline",
            "900",
            "--out",
            str(tmp_path / "check"),
        ],
        cwd=REPO,
        env=cli_env(),
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "check" / "determinism.json").read_text())
    for row in rows:
        assert row["first_diff"] is None and row["compared"] > 0, json.dumps(row)


def test_compiled_flex_attention_repeats_bitwise_and_matches_sdpa():
    """FlexAttention (NVFP4TRAIN_DETERMINISTIC_ATTENTION=flex) as the compiled model runs it: twice the same bits."""
    torch.manual_seed(0)
    q = torch.randn(8, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, 2, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flex = torch.compile(lambda q, k, v: blocks.flex_causal_attention(q, k, v, gqa=True))
    with deterministic_mode(True):
        first, second = _twice(flex, q, k, v)
    _assert_bitwise(first, second)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True
    )
    assert ((first[0].float() - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.slow
def test_evaluating_a_deterministic_run_twice_gives_the_same_eval_json(tmp_path):
    """eval follows the run's train.deterministic: two evaluations (two processes, each autotuning afresh)
    of one checkpoint agree to the last digit (without it, mamba-ssm's timing-picked kernels made the
    held-out losses differ around 1e-5)."""
    run = tmp_path / "run"
    train = run_and_kill_on_timeout(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            "model=hybrid_tiny",
            "train.max_steps=5",
            "train.seq_len=256",
            "train.global_batch_size=8",
            "train.deterministic=true",
            "train.progress=false",
            f"out_dir={run}",
        ],
        cwd=REPO,
        env=cli_env(),
        timeout=900,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    results = []
    for k in range(2):
        env = {**cli_env(), "TRITON_CACHE_DIR": str(tmp_path / f"triton{k}")}  # no autotuning result shared
        proc = run_and_kill_on_timeout(
            [sys.executable, "-m", "nvfp4train.eval", f"run_dir={run}", "tasks=all", "max_items=20"],
            cwd=REPO,
            env=env,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((run / "eval.json").read_text())
        assert result["deterministic"] is True
        results.append({k: v for k, v in result.items() if k != "seconds"})
    assert results[0] == results[1]
