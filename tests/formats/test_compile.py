"""torch.compile: the training fast path compiles as one graph with the same bits (CPU), and the
compiled-twin dispatch (``formats.compiled``) picks eager/compiled as documented. The CUDA twin's
bit-equality is checked in test_cuda.py."""

from __future__ import annotations

import logging

import pytest
import torch

from nvfp4train.formats import compiled, mxfp4, nvfp4


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


@pytest.mark.slow
def test_nvfp4_fake_quantize_compiles_as_one_graph_with_the_same_bits():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    x[3, :8] = -0.0  # the sign-of-zero rule must survive compilation
    compiled_fn = torch.compile(nvfp4.fake_quantize, fullgraph=True)  # fails on any graph break
    eager, s_eager = nvfp4.fake_quantize(x, (16, 16))
    fast, s_fast = compiled_fn(x, (16, 16))
    assert torch.equal(as_bits(eager), as_bits(fast)) and torch.equal(s_eager, s_fast)


def test_dispatch_uses_eager_on_cpu_and_honours_the_env_switch(monkeypatch):
    x = torch.zeros(16, 32)
    assert not compiled.enabled_for(x)  # CPU: eager
    cuda_like = torch.empty(0, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    assert not compiled.enabled_for(cuda_like)  # opt-in
    monkeypatch.setenv(compiled.ENV_VAR, "1")
    assert compiled.enabled_for(cuda_like)
    monkeypatch.setenv(compiled.ENV_VAR, "0")
    assert not compiled.enabled_for(cuda_like)


def test_a_failing_compile_falls_back_to_eager_once_with_a_warning(monkeypatch, caplog):
    calls = []

    def impl(x, k):
        calls.append(k)
        return x * k

    def broken_compile(fn):
        def run(*args):
            raise RuntimeError("no triton here")

        return run

    monkeypatch.setattr(compiled, "enabled_for", lambda x: not compiled._broken)
    monkeypatch.setattr(compiled, "compiled", broken_compile)
    monkeypatch.setattr(compiled, "_broken", False)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert torch.equal(compiled.run(impl, torch.ones(2), 3.0), torch.full((2,), 3.0))
    assert compiled._broken and "no triton here" in caplog.text and compiled.ENV_VAR in caplog.text
    assert torch.equal(compiled.run(impl, torch.ones(2), 2.0), torch.full((2,), 2.0))  # eager, no retry
    assert calls == [3.0, 2.0]


def test_argument_errors_are_raised_eagerly_before_any_compiled_code(monkeypatch):
    monkeypatch.setattr(compiled, "run", lambda *a: pytest.fail("impl reached with bad arguments"))
    x = torch.zeros(16, 64)
    with pytest.raises(ValueError, match="rounding"):
        nvfp4.fake_quantize(x, rounding="nearest")
    with pytest.raises(ValueError, match="tile"):
        nvfp4.quantize(x, tile=(2, 16))
    with pytest.raises(ValueError, match="scale_rule"):
        mxfp4.fake_quantize(x, scale_rule="round")
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4.quantize(torch.zeros(4, 48))
