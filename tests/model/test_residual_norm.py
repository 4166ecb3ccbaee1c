"""The residual add fused into the next block's RMSNorm (model/residual_norm.py): the stream, the norm's
output and the gradients of x, h and the weight against the add followed by the norm. In Triton's interpreter
on CPU against the PyTorch norm (a subprocess with TRITON_INTERPRET=1); on a GPU against the separate add and
fused_norm.py's kernel (marked gpu): in an FP32 stream the same stream, output and weight gradient, bit for bit,
and input gradients within an ulp. The model's blocks defer their add to the
next block's norm: the same logits and loss as x + mixer(norm(x)) block by block."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import run_check_in_triton_interpreter

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def _reference(x, h, weight, eps, out_dtype):
    s = x + h
    s32 = s.float()
    y = (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(out_dtype)
    return s, y


def check(device: str) -> None:
    from nvfp4train.model.residual_norm import add_rms_norm_backward, add_rms_norm_forward

    gen = torch.Generator().manual_seed(0)
    # (rows, width): a width no power of two (masked columns) and more rows than programs (4 a program on CPU)
    for (M, N), stream_dtype in (((37, 300), torch.float32), ((9, 256), torch.bfloat16)):
        x = (torch.randn(M, N, generator=gen) * 3).to(device, stream_dtype)
        h = torch.randn(M, N, generator=gen).to(device, torch.bfloat16)
        weight = (torch.rand(N, generator=gen) + 0.5).to(device)
        dy = torch.randn(M, N, generator=gen).to(device, torch.bfloat16)
        dstream = torch.randn(M, N, generator=gen).to(device, stream_dtype)
        stream, y, rstd = add_rms_norm_forward(x, h, weight, 1e-5, torch.bfloat16)
        xr, hr, wr = (t.clone().requires_grad_(True) for t in (x, h, weight))
        want_stream, want_y = _reference(xr, hr, wr, 1e-5, torch.bfloat16)
        assert stream.dtype == stream_dtype
        torch.testing.assert_close(stream.float(), want_stream.float(), rtol=2**-7, atol=0)  # the add, rounded
        torch.testing.assert_close(y.float(), want_y.float(), rtol=1e-2, atol=1e-2)
        torch.autograd.backward((want_stream, want_y), (dstream, dy))
        dx, dh, dw = add_rms_norm_backward(dy, dstream, stream, weight, rstd, torch.bfloat16)
        assert dx.dtype == stream_dtype and dh.dtype == torch.bfloat16 and dw.dtype == torch.float32
        tol = 1e-4 if stream_dtype == torch.float32 else 2e-2
        torch.testing.assert_close(dx.float(), xr.grad.float(), rtol=tol, atol=tol)
        torch.testing.assert_close(dh.float(), hr.grad.float(), rtol=2e-2, atol=2e-2)
        # h's gradient is x's in h's dtype (within one BF16 step: the interpreter truncates where a GPU rounds)
        torch.testing.assert_close(dh.float(), dx.to(torch.bfloat16).float(), rtol=2**-7, atol=0)
        torch.testing.assert_close(dw, wr.grad, rtol=tol, atol=tol * wr.grad.abs().max().item())


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_fused_add_norm_in_the_interpreter():
    run_check_in_triton_interpreter("tests.model.test_residual_norm")


@pytest.mark.gpu
@pytest.mark.parametrize("stream_dtype", [torch.float32, torch.bfloat16])
def test_fused_add_norm_is_the_add_then_the_norm_on_the_gpu(stream_dtype):
    from nvfp4train.model import blocks
    from nvfp4train.model.fused_norm import fused_norm_available

    if not (torch.cuda.is_available() and fused_norm_available()):
        pytest.skip("needs CUDA and mamba-ssm's Triton kernels")
    norm = blocks.RMSNorm(2048, 1e-5).cuda()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(2, 1000, 2048, device="cuda", generator=gen).to(stream_dtype)
    h0 = torch.randn(2, 1000, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    dy = torch.randn(2, 1000, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    dstream = torch.randn(2, 1000, 2048, device="cuda", generator=gen).to(stream_dtype)
    results = []
    for fused in (True, False):
        x, h = x0.clone().requires_grad_(True), h0.clone().requires_grad_(True)
        if fused:
            stream, y = norm.add_and_norm(x, h, torch.bfloat16)
        else:  # the add, then the fused norm alone (fused_norm.py), as the blocks ran before
            stream = x + h
            y = norm(stream, torch.bfloat16)
        torch.autograd.backward((stream, y), (dstream, dy))
        results.append([stream, y, x.grad, h.grad, norm.weight.grad.clone()])
        norm.weight.grad = None
    for name, got, want in zip(("stream", "y", "dx", "dh", "dweight"), *results):
        assert got.dtype == want.dtype, name
        if stream_dtype == torch.float32 and name in ("stream", "y", "dweight"):
            assert torch.equal(got, want), f"{name}: {(got.float() - want.float()).abs().max().item()}"
        elif stream_dtype == torch.float32:  # the compiler contracts the norm's last multiply and the add into
            # one FMA, rounded once where the separate kernels round twice: dx within an FP32 ulp or two, dh (BF16)
            # within one BF16 step
            ulps = 2 * 2**-23 if name == "dx" else 2**-7
            scale = want.float().abs().max().item()
            torch.testing.assert_close(got.float(), want.float(), rtol=ulps, atol=2**-22 * scale, msg=name)
        else:  # the separate path rounds the norm's dx to BF16 before adding dstream; so does the kernel
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2, msg=name)


@pytest.mark.gpu
def test_fused_add_norm_ops_pass_opcheck():
    from nvfp4train.model.fused_norm import fused_norm_available

    if not (torch.cuda.is_available() and fused_norm_available()):
        pytest.skip("needs CUDA and mamba-ssm's Triton kernels")
    from nvfp4train.model import residual_norm

    x = torch.randn(64, 512, device="cuda", requires_grad=True)
    h = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(512, device="cuda", requires_grad=True)
    torch.library.opcheck(residual_norm._add_rms_norm, (x, h, w, 1e-5, torch.bfloat16))


def test_blocks_defer_the_residual_add_to_the_next_norm():
    """HybridLM's forward (each block adds the previous block's mixer output before its norm) gives the logits
    and loss of x + mixer(norm(x)) block by block, bit for bit, with activation checkpointing too."""
    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig

    cfg = ModelConfig.from_dict({**load_preset("model", "hybrid_tiny"), "pattern": "M*-M-"})
    torch.manual_seed(0)
    model = HybridLM(cfg).double()
    tokens = torch.randint(0, cfg.vocab_size, (2, 24))
    x = model.embedding(tokens)
    for block in model.blocks:
        x = x + block.mixer(block.norm(x))
    want = model.lm_head(model.final_norm(x))
    assert torch.equal(model(tokens), want)
    model.checkpointed = set(range(len(model.blocks)))
    loss = model(tokens, tokens)
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].norm.weight.grad is not None
