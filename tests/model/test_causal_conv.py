"""The Triton causal conv1d + SiLU (model/causal_conv.py) against the PyTorch path (F.conv1d): output and
the gradients of x, weight and bias, for a strided x (the mixer's slice of in_proj's output), sequences
that no tile divides, FP32 and BF16 inputs. On CPU the kernels run in Triton's interpreter (a subprocess
with TRITON_INTERPRET=1, read when triton is imported); on a GPU natively (marked gpu)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import run_check_in_triton_interpreter

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def check(device: str) -> None:
    from nvfp4train.model.causal_conv import causal_conv1d_silu_triton
    from nvfp4train.model.ssd import causal_conv1d_silu

    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
        # K = 4 has its own kernels (model/causal_conv.py): 150 positions span three of their programs, the
        # last one partial, and 300 channels two channel blocks, the last one partial
        for b, T, C, K in ((2, 70, 96, 4), (1, 150, 300, 4), (1, 33, 40, 3)):
            wide = torch.randn(b, T, C + 24, generator=gen)  # x is a slice: strides of the wider tensor
            weight = torch.randn(C, 1, K, generator=gen) * 0.5
            bias = torch.randn(C, generator=gen) * 0.1
            grad = torch.randn(b, T, C, generator=gen)
            results = []
            for triton_path in (True, False):
                x = wide.to(device, dtype).requires_grad_(True)
                w, bb = weight.to(device).requires_grad_(True), bias.to(device).requires_grad_(True)
                xs = x[:, :, 8 : 8 + C]
                with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):  # as in training
                    y = (
                        causal_conv1d_silu_triton(xs, w, bb)
                        if triton_path
                        else causal_conv1d_silu(xs, w, bb, use_kernel=False)
                    )
                (y.float() * grad.to(device)).sum().backward()
                results.append([t.float().cpu() for t in (y, x.grad, w.grad, bb.grad)])
                assert y.dtype == dtype and y.shape == (b, T, C)
            for name, got, want in zip(("y", "dx", "dw", "dbias"), *results):
                torch.testing.assert_close(
                    got,
                    want,
                    rtol=tol,
                    atol=tol * max(1.0, want.abs().max().item()),
                    msg=lambda m: f"{name} {dtype} {(b, T, C, K)}: {m}",
                )
            assert results[0][1][:, :, :8].abs().max() == 0  # no gradient outside the slice
            check_dx_into_a_slice(device, dtype, b, T, C, K, gen)


def check_dx_into_a_slice(device, dtype, b, T, C, K, gen) -> None:
    """conv_silu_backward writes dx into a given slice of a wider tensor (the Mamba mixer's fused op writes
    into its slice of in_proj's output gradient): the values of a new dx, nothing outside the slice."""
    from nvfp4train.model.causal_conv import conv_silu_backward

    x = torch.randn(b, T, C, generator=gen).to(device, dtype)
    weight, bias = torch.randn(C, 1, K, generator=gen).to(device), torch.randn(C, generator=gen).to(device)
    dy = torch.randn(b, T, C, generator=gen).to(device, dtype)
    want = conv_silu_backward(dy, x, weight, bias)
    wide = torch.full((b, T, C + 11), 7.0, device=device, dtype=dtype)
    got = conv_silu_backward(dy, x, weight, bias, dx=wide[:, :, 5 : 5 + C])
    assert got[0].data_ptr() == wide[:, :, 5:].data_ptr()
    for name, g, w in zip(("dx", "dw", "dbias"), got, want):
        assert torch.equal(g, w), f"{name} {dtype} {(b, T, C, K)}"
    assert (wide[:, :, :5] == 7).all() and (wide[:, :, 5 + C :] == 7).all()
    with pytest.raises(ValueError, match="dx must be"):
        conv_silu_backward(dy, x, weight, bias, dx=wide[:, :, 5 : 5 + C].transpose(0, 1))


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_triton_conv_in_the_interpreter():
    run_check_in_triton_interpreter("tests.model.test_causal_conv")


@pytest.mark.gpu
def test_triton_conv_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check("cuda")


def test_the_mixer_uses_the_kernel_on_cuda_only():
    """On CPU the mixer's conv is F.conv1d; the channels-last entry gives what the conv of the
    transposed input gives."""
    from nvfp4train.model.ssd import causal_conv1d_silu

    x = torch.randn(2, 9, 6, dtype=torch.float64)
    w, bias = torch.randn(6, 1, 4, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    y = causal_conv1d_silu(x, w, bias)
    ref = torch.nn.functional.conv1d(torch.nn.functional.pad(x.transpose(1, 2), (3, 0)), w, bias, groups=6)
    torch.testing.assert_close(y, torch.nn.functional.silu(ref).transpose(1, 2))


@pytest.mark.skipif(INTERPRETING, reason="compiles for the GPU")
def test_conv_kernels_compile_for_sm90():
    """Both kernels compile for an H100 (no GPU needed): GPU-only front-end errors show up in CI."""
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from nvfp4train.model import causal_conv as cc

    common = {
        "x_ptr": "*bf16",
        "w_ptr": "*fp32",
        "bias_ptr": "*fp32",
        "T": "i32",
        "C": "i32",
        "stride_b": "i64",
        "stride_t": "i32",
    }
    fwd = {**common, "y_ptr": "*bf16"}
    bwd = {
        **common,
        "dy_ptr": "*bf16",
        "dx_ptr": "*bf16",
        "dw_ptr": "*fp32",
        "db_ptr": "*fp32",
        "dx_stride_b": "i64",
        "dx_stride_t": "i32",
        "n_t": "i32",
    }
    tiles = {"K": 4, "BT": cc.BLOCK_T, "BC": cc.BLOCK_C}
    rows = {"ROWS": cc.ROWS4, "BC": cc.BLOCK_C4, "FAST": True}
    for kernel, signature, constexprs in (
        (cc._conv_silu_fwd_kernel, fwd, tiles),
        (cc._conv_silu_bwd_kernel, bwd, tiles),
        (cc._conv4_silu_fwd_kernel, fwd, rows),
        (cc._conv4_silu_bwd_kernel, bwd, rows),
    ):
        signature = {**{k: "constexpr" for k in constexprs}, **signature}
        signature = {name: signature[name] for name in kernel.arg_names}
        compiled = triton_compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32)
        )
        assert ".entry" in compiled.asm["ptx"]
