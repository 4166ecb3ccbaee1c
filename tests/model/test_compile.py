"""torch.compile of the whole model: one graph (no break outside the quantized linear), the compiled loss
and gradients equal eager ones, Inductor's code of the model gives eager's logits and that of the chunked
loss writes no FP32 logits. On CPU with the PyTorch SSD; the Triton SSD's custom op is checked on a GPU
(test_compile_triton_ssd_one_graph)."""

import os
import re
import shutil

import pytest
import torch
import torch._dynamo

from nvfp4train.config import load_preset
from nvfp4train.model import HybridLM, ModelConfig, build_model, linear_cross_entropy
from nvfp4train.precision import PrecisionPolicy, build_linear_factory

pytestmark = pytest.mark.integration  # compiles the model (Inductor's C++ code on CPU): not the quick loop
needs_a_cxx_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="Inductor's CPU code needs a C++ compiler"
)


def _model(precision: str, device="cpu", **overrides) -> HybridLM:
    cfg = ModelConfig.from_dict({**load_preset("model", "hybrid_tiny"), **overrides})
    policy = PrecisionPolicy.from_dict(load_preset("precision", precision))
    torch.manual_seed(0)
    return HybridLM(cfg, layer_factory=build_linear_factory(policy, n_blocks=len(cfg.pattern), seed=0)).to(device)


def _batch(model, device="cpu", b=2, T=33):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.vocab_size, (b, T + 1), generator=g).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def _loss(model, x, y):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return model(x, y)


# FP8 keeps the first block and the last two in BF16: with "M-M-M-", blocks 1 and 3 are FP8 MLPs (one node each,
# precision/mlp.py)
FP8_MLPS = {"pattern": "M-M-M-", "vocab_size": 512}


@pytest.mark.parametrize(("precision", "overrides"), [("bf16", {}), ("nvfp4", {}), ("fp8_blockwise", FP8_MLPS)])
def test_no_graph_break_outside_the_quantized_linear(precision, overrides):
    model = _model(precision, **overrides)
    explained = torch._dynamo.explain(_loss)(model, *_batch(model))
    outside = [
        b.reason
        for b in explained.break_reasons
        if not any("precision/linear.py" in frame.filename for frame in b.user_stack)
    ]
    assert outside == []
    if precision != "nvfp4":
        assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compiled_loss_and_grads_match_eager():
    eager, compiled = _model("bf16"), _model("bf16")
    x, y = _batch(eager)
    torch._dynamo.reset()
    step = torch.compile(_loss, backend="aot_eager", fullgraph=True)  # traced and partitioned as inductor's input
    ref, out = _loss(eager, x, y), step(compiled, x, y)
    ref.backward()
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.slow
@needs_a_cxx_compiler
def test_torch_compile_matches_eager(small_cfg_dict):
    """Inductor's code (the default backend) of a model with all three block types gives eager's logits."""
    torch.manual_seed(0)
    model = build_model(small_cfg_dict)
    tokens = torch.randint(0, 97, (2, 24))
    eager = model(tokens)
    torch._dynamo.reset()  # what other tests compiled in this process must not make this one's shapes dynamic
    compiled = torch.compile(model, fullgraph=True)(tokens)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


@needs_a_cxx_compiler
def test_compiled_loss_writes_no_fp32_logits():
    """Compiled (Inductor's CPU code here), a chunk's logits are only read after their GEMM: the only
    buffers of a chunk's logits' shape are BF16 (the logits and their gradient); and the compiled
    loss and gradients equal eager ones."""
    from torch._inductor.utils import run_and_get_code

    g = torch.Generator().manual_seed(4)
    h1 = torch.randn(24, 16, generator=g, requires_grad=True)
    w1 = (0.3 * torch.randn(300, 16, generator=g)).requires_grad_()
    y = torch.randint(0, 300, (24,), generator=g)
    y[5] = -100
    h2, w2 = h1.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()
    torch._dynamo.reset()
    step = torch.compile(linear_cross_entropy, fullgraph=True)

    def compiled():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return step(h2, w2, y, chunk_tokens=8)

    out, codes = run_and_get_code(compiled)
    chunk_logits = re.findall(r"empty_strided_cpu\(\(8, 300\), \(300, 1\), torch\.(\w+)\)", "\n".join(codes))
    assert chunk_logits and set(chunk_logits) == {"bfloat16"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = linear_cross_entropy(h1, w1, y, chunk_tokens=8)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    ref.backward()
    out.backward()
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
def test_compile_triton_ssd_one_graph():
    """The Triton scan is a custom op: the model compiles to one graph and matches eager (BF16 rounding)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nvfp4train.model.ops import triton_ssd_available

    if not triton_ssd_available():
        pytest.skip("mamba-ssm's Triton SSD is not installed")
    eager, compiled = _model("bf16", "cuda", ssd_backend="triton"), _model("bf16", "cuda", ssd_backend="triton")
    x, y = _batch(eager, "cuda", b=2, T=256)
    explained = torch._dynamo.explain(_loss)(compiled, x, y)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    torch._dynamo.reset()
    ref, out = _loss(eager, x, y), torch.compile(_loss)(compiled, x, y)
    ref.backward()
    out.backward()
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=5e-2, atol=5e-3, msg=name)


@pytest.mark.parametrize(
    ("mode", "precision", "small"),
    [
        ("full", "nvfp4", {"pattern": "M*-", "vocab_size": 512}),
        ("selective", "nvfp4", {"pattern": "M*-", "vocab_size": 512}),
        ("full", "fp8_blockwise", FP8_MLPS),
    ],
)
def test_activation_checkpointing_gives_the_same_grads(mode, precision, small):
    """Recomputing blocks in backward changes memory, not numbers (quantized linears recompute their forward
    quantization exactly; FP8 MLPs run as one node)."""
    plain, ckpt = _model(precision, **small), _model(precision, **small)
    ckpt.set_activation_checkpointing(mode)
    assert len(ckpt.checkpointed) == (len(ckpt.blocks) if mode == "full" else (len(ckpt.blocks) + 1) // 2)
    x, y = _batch(plain)
    ref, out = _loss(plain, x, y), _loss(ckpt, x, y)
    ref.backward()
    out.backward()
    assert torch.equal(out, ref)
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)
