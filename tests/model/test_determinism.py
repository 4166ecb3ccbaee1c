"""`train.deterministic`: the key validates, the run switches torch's modes on (and off again afterwards), the
model picks its deterministic attention and SSD paths, and two CPU runs with it are bitwise equal.

What only a GPU can show (bitwise-equal GPU runs, eager and compiled, DDP, kill -9 and resume) is in
tests/gpu/test_determinism.py and scripts/check_determinism_gpu.py."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
import yaml

from nvfp4train.config import ConfigError, RunConfig, compose
from nvfp4train.model import blocks, ops, ssd
from nvfp4train.train import determinism
from nvfp4train.train.loop import run
from tests.conftest import read_metrics

TINY = [
    "train.max_steps=3",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=32",
    "train.global_batch_size=2",
    "train.micro_batch_size=2",
    "train.log_every=1",
    "model.d_model=64",
    "model.vocab_size=8192",
    "train.device=cpu",
]


def config(out, *overrides) -> RunConfig:
    return RunConfig.from_omegaconf(compose("train", [f"out_dir={out}", *TINY, *overrides]))


@pytest.fixture
def no_cublas_env(monkeypatch):
    monkeypatch.delenv(determinism.CUBLAS_ENV, raising=False)


# ----------------------------------------------------------------------------------------------- the key
def test_the_key_defaults_to_false_and_takes_booleans(tmp_path):
    assert config(tmp_path).train.deterministic is False
    assert config(tmp_path, "train.deterministic=true").train.deterministic is True


def test_a_bad_value_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.deterministic"):
        config(tmp_path, "train.deterministic=sometimes")


# ------------------------------------------------------------------------------------- torch's modes
def _modes() -> dict:
    return {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn": torch.backends.cudnn.deterministic,
        "benchmark": torch.backends.cudnn.benchmark,
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
        "inductor": torch._inductor.config.deterministic,
        "nan_fill": torch.utils.deterministic.fill_uninitialized_memory,
    }


def test_the_mode_switches_everything_on_and_restores_it(no_cublas_env):
    import torch._inductor.config  # noqa: F401  (has `deterministic` on this torch)

    before = _modes()
    assert before["algorithms"] is False
    with determinism.deterministic_mode(True):
        inside = _modes()
        assert os.environ[determinism.CUBLAS_ENV] == ":4096:8"
    assert inside == {
        "algorithms": True,
        "warn_only": False,
        "cudnn": True,
        "benchmark": False,
        "flash": False,
        "mem_efficient": False,
        "cudnn_sdp": False,
        "inductor": True,
        "nan_fill": False,  # torch's NaN fill of new tensors: a kernel per allocation, and no bit of a run changes
    }
    assert _modes() == before
    with determinism.deterministic_mode(False):
        assert _modes() == before


def test_a_deterministic_cublas_setting_is_kept(monkeypatch):
    monkeypatch.setenv(determinism.CUBLAS_ENV, ":16:8")
    with determinism.deterministic_mode(True):
        assert os.environ[determinism.CUBLAS_ENV] == ":16:8"


@pytest.mark.parametrize("value, cuda_started", [(":0:0", False), (None, True)])
def test_a_cublas_workspace_it_cannot_set_is_refused_in_one_line(monkeypatch, value, cuda_started):
    if value is None:
        monkeypatch.delenv(determinism.CUBLAS_ENV, raising=False)
    else:
        monkeypatch.setenv(determinism.CUBLAS_ENV, value)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda_started)
    with (
        pytest.raises(ConfigError, match=r"CUBLAS_WORKSPACE_CONFIG=:4096:8") as e,
        determinism.deterministic_mode(True),
    ):
        pass
    assert "\n" not in str(e.value)
    assert not torch.are_deterministic_algorithms_enabled()


# ------------------------------------------------------------------------------- which kernels run
def test_deterministic_attention_is_flex_where_compiled_and_math_sdpa_where_eager():
    assert blocks.attention_backend(is_cuda=True, deterministic=True) == "math"
    assert blocks.attention_backend(is_cuda=True, deterministic=True, compiling=True) == "flex"
    assert blocks.attention_backend(is_cuda=True, deterministic=False) == "auto"
    assert blocks.attention_backend(is_cuda=False, deterministic=True) == "auto"
    # math SDPA compiled too when asked for (it replays runs made with it)
    assert blocks.attention_backend(True, True, compiling=True, choice="math") == "math"
    assert blocks.attention_backend(True, True, compiling=False, choice="flex") == "math"
    assert blocks.attention_backend(True, False, compiling=True, choice="flex") == "auto"


def test_flex_causal_attention_is_causal_sdpa():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 40, 16)
    k, v = torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(blocks.flex_causal_attention(q, k, v, gqa=True), expected, rtol=1e-5, atol=1e-5)


def test_the_nan_fill_comes_on_on_request_and_a_bad_value_is_one_line(monkeypatch, no_cublas_env):
    with determinism.deterministic_mode(True):
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    monkeypatch.setenv(determinism.FILL_ENV, "1")
    with determinism.deterministic_mode(True):
        assert torch.empty(4).isnan().all()  # what the fill is for: a read of memory nobody wrote shows
    monkeypatch.setenv(determinism.FILL_ENV, "yes")
    with (
        pytest.raises(ConfigError, match=r"^NVFP4TRAIN_FILL_UNINITIALIZED=yes: allowed 0, 1 \(1: torch fills"),
        determinism.deterministic_mode(True),
    ):
        pass
    assert not torch.are_deterministic_algorithms_enabled()


def test_an_unknown_deterministic_attention_is_refused_in_one_line(monkeypatch, no_cublas_env):
    monkeypatch.setenv(blocks.DETERMINISTIC_ATTENTION_ENV, "fast")
    with (
        pytest.raises(ConfigError, match="NVFP4TRAIN_DETERMINISTIC_ATTENTION=fast: allowed flex, math"),
        determinism.deterministic_mode(True),
    ):
        pass
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize(
    "backend, cuda, det, available, det_mode, expected",
    [
        ("auto", True, False, True, False, "triton"),
        ("auto", True, True, True, True, "triton"),  # mamba-ssm >= 2.3: its deterministic mode, configs pinned
        ("auto", True, True, True, False, "torch"),  # an older mamba-ssm accumulates with atomics
        ("auto", True, True, False, False, "torch"),
        ("auto", False, True, True, True, "torch"),
        ("torch", True, True, True, True, "torch"),
        ("triton", True, True, True, True, "triton"),
    ],
)
def test_the_ssd_backend_resolves(backend, cuda, det, available, det_mode, expected):
    assert ssd.resolve_ssd_backend(backend, cuda, det, available, det_mode) == expected


@pytest.mark.parametrize(
    "backend, cuda, det_mode, message",
    [
        ("triton", False, True, "needs CUDA"),
        ("triton", True, False, "mamba-ssm >= 2.3"),
        ("bogus", True, True, "not one of auto, torch, triton"),
    ],
)
def test_an_ssd_backend_that_cannot_run_is_one_line(backend, cuda, det_mode, message):
    with pytest.raises(ValueError, match=message):
        ssd.resolve_ssd_backend(backend, cuda, True, True, det_mode)


@pytest.mark.parametrize(
    "cuda, det, extension, triton_ok, expected",
    [
        (True, False, True, True, "causal_conv1d"),
        (True, True, True, True, "triton"),  # the extension's backward is not audited: our kernels
        (True, True, False, False, "torch"),  # F.conv1d: cuDNN, deterministic with cudnn.deterministic
        (False, True, True, True, "torch"),
    ],
)
def test_the_conv_backend_resolves(cuda, det, extension, triton_ok, expected):
    assert ssd.conv_backend(cuda, det, extension, triton_ok) == expected


def test_the_math_attention_path_gives_sdpa_s_result(small_cfg_dict, monkeypatch):
    from nvfp4train.model.config import ModelConfig

    torch.manual_seed(0)
    from nvfp4train.model.layers import PLAIN_LAYERS

    attn = blocks.Attention(ModelConfig.from_dict(small_cfg_dict), 1, PLAIN_LAYERS)
    x = torch.randn(2, 12, small_cfg_dict["d_model"], requires_grad=True)
    y_auto = attn(x)
    seen = []
    monkeypatch.setattr(blocks, "attention_backend", lambda *args: seen.append(1) or "math")
    y_math = attn(x)
    assert seen and torch.allclose(y_math, y_auto, atol=1e-6)
    y_math.sum().backward()
    assert torch.isfinite(x.grad).all()


# --------------------------------------------------------------------------------- the PyTorch scan
@pytest.mark.parametrize("shape, dim", [((3, 5, 37), -1), ((2, 16, 16), -2), ((4, 1), -1), ((2, 128), 1)])
def test_the_log_step_cumsum_is_a_cumsum(shape, dim):
    x = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(ssd.log_step_cumsum(x, dim), x.cumsum(dim), rtol=1e-12, atol=1e-12)


def test_the_scan_with_fixed_order_cumsums_matches_the_recurrence(monkeypatch):
    """The chunked scan as it runs on CUDA in deterministic mode (log-step cumsums) against the recurrence."""
    torch.manual_seed(0)
    b, T, h, p, g, n = 2, 45, 4, 3, 2, 5
    x = torch.randn(b, T, h, p, dtype=torch.float64, requires_grad=True)
    dt = torch.randn(b, T, h, dtype=torch.float64)
    A = -torch.rand(h, dtype=torch.float64) * 4 - 0.5
    B, C = torch.randn(b, T, g, n, dtype=torch.float64), torch.randn(b, T, g, n, dtype=torch.float64)
    D, dt_bias = torch.randn(h, dtype=torch.float64), torch.randn(h, dtype=torch.float64)
    reference = ssd.ssd_recurrent(x, dt, A, B, C, D, dt_bias)
    plain = ssd.ssd_chunked_torch(x, dt, A, B, C, D, dt_bias, chunk_size=8)
    calls = []
    monkeypatch.setattr(ssd, "deterministic_scan_needed", lambda t: calls.append(1) or True)
    fixed = ssd.ssd_chunked_torch(x, dt, A, B, C, D, dt_bias, chunk_size=8)
    assert len(calls) == 3  # the two in-chunk cumsums and the one over chunks
    torch.testing.assert_close(fixed, reference, rtol=1e-9, atol=1e-9)
    (g_fixed,) = torch.autograd.grad(fixed.square().sum(), x)
    (g_plain,) = torch.autograd.grad(plain.square().sum(), x)
    torch.testing.assert_close(g_fixed, g_plain, rtol=1e-9, atol=1e-9)


def test_mamba_ssm_s_autotuned_kernels_are_pinned_and_given_back():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    configs = [
        triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64}, num_stages=3, num_warps=8),
        triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32}, num_stages=4, num_warps=4),  # 8192
        triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64}, num_stages=4, num_warps=2),  # 8192 too
        triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}, num_stages=2, num_warps=4),
    ]

    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def kernel(x_ptr, n, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
        pass

    module = types.ModuleType("fake_ssd")
    module.kernel, module.not_a_kernel = kernel, 3
    kernel.cache[("key",)] = configs[0]  # a choice timed earlier in this process
    assert ops.pin_triton_configs([module], True) == 1
    assert kernel.configs == [configs[1]] and not kernel.cache  # the smallest, the first of equals
    assert ops.pin_triton_configs([module], True) == 0
    assert ops.pin_triton_configs([module], False) == 1
    assert kernel.configs == configs


# -------------------------------------------------------------------------------------- whole runs
def test_two_deterministic_cpu_runs_are_bitwise_equal_and_say_so(tmp_path, no_cublas_env):
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        run(config(out, "train.deterministic=true"))
        assert not torch.are_deterministic_algorithms_enabled()  # given back after the run
    a, b = ([(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(out) if "loss" in r] for out in runs)
    assert len(a) == 3 and a == b
    first = read_metrics(runs[0])[0]
    assert first["step"] == 1 and first["deterministic"] is True
    assert yaml.safe_load((runs[0] / "config.yaml").read_text())["train"]["deterministic"] is True
    assert "deterministic mode: torch deterministic algorithms on" in (runs[0] / "train.log").read_text()


def test_a_default_run_records_that_it_was_not_deterministic(tmp_path):
    run(config(tmp_path))
    assert read_metrics(tmp_path)[0]["deterministic"] is False
    assert (
        json.loads(json.dumps(yaml.safe_load((tmp_path / "config.yaml").read_text())))["train"]["deterministic"]
        is False
    )


def test_mamba_s_backward_cumsums_are_let_through_only_for_that_call():
    with ops.backward_cumsums_allowed():  # outside deterministic mode: nothing changes
        assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with ops.backward_cumsums_allowed():
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
