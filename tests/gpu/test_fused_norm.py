"""The Triton RMSNorm and gated RMSNorm (CUDA) equal the PyTorch ones in blocks.py: outputs and the
gradients of input, gate and weight, for the residual stream's FP32 and the mixer's BF16 inputs."""

import pytest
import torch

from nvfp4train.model.blocks import GatedRMSNorm, RMSNorm

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_kernels():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nvfp4train.model.fused_norm import fused_norm_available

    if not fused_norm_available():
        pytest.skip("mamba-ssm's Triton layernorm_gated is not installed")


def _torch_forward(module, *inputs):
    """The module's PyTorch path (what runs on CPU), on the same CUDA tensors."""
    from nvfp4train.model import blocks

    saved, blocks.fused_norm_available = blocks.fused_norm_available, lambda: False
    try:
        return module(*inputs)
    finally:
        blocks.fused_norm_available = saved


def _grads(out, tensors, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out.backward(torch.randn(out.shape, generator=g, device="cuda", dtype=out.dtype))
    grads = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_torch(dtype):
    norm = RMSNorm(512, 1e-5).cuda()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 100, 512, device="cuda", dtype=dtype, requires_grad=True)
    fused, ref = norm(x), _torch_forward(norm, x)
    assert fused.dtype == ref.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(fused, ref, **tol)
    for a, b in zip(_grads(fused, [x, norm.weight], 0), _grads(ref, [x, norm.weight], 0)):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 if dtype == torch.bfloat16 else 1e-4)


def test_gated_rms_norm_matches_torch():
    norm = GatedRMSNorm(512, 128, 1e-5).cuda()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    zxbc = torch.randn(4, 100, 1024 + 64, device="cuda", dtype=torch.bfloat16)
    z = zxbc[..., :512].detach().requires_grad_()  # in the model z is a strided slice of in_proj's output
    y = torch.randn(4, 100, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fused, ref = norm(y, z), _torch_forward(norm, y, z)
    torch.testing.assert_close(fused, ref, rtol=1.6e-2, atol=1e-2)
    for a, b in zip(_grads(fused, [y, z, norm.weight], 1), _grads(ref, [y, z, norm.weight], 1)):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_custom_ops_pass_opcheck():
    from nvfp4train.model.fused_norm import _rms_norm

    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    z = torch.randn(64, 256, device="cuda", requires_grad=True)
    w = torch.rand(256, device="cuda", requires_grad=True)
    torch.library.opcheck(_rms_norm, (x, w, None, 1e-5, 256, torch.float32))
    torch.library.opcheck(_rms_norm, (x, w, z, 1e-5, 64, torch.float32))
    torch.library.opcheck(_rms_norm, (x, w, None, 1e-5, 256, torch.bfloat16))


def test_bf16_output_of_an_fp32_input_matches_the_cast_of_the_fp32_output():
    """out_dtype=bf16 (the blocks' norms under autocast) gives the FP32 output cast to BF16 up to the
    kernel's own FP32 rounding, which differs with the output dtype: on an H100 2 of 236,544 elements
    one BF16 ulp apart. Its backward from a BF16 dy gives FP32 dx and dw within FP32 rounding of the
    backward from the same dy widened."""
    norm = RMSNorm(1024, 1e-5).cuda()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 77, 1024, device="cuda", requires_grad=True)
    out16, out32 = norm(x, torch.bfloat16), norm(x)
    cast = out32.to(torch.bfloat16)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), cast.float(), rtol=2.0**-7, atol=0.0)  # one BF16 ulp at most
    assert float((out16 == cast).double().mean()) > 0.999
    dy = torch.randn(out16.shape, device="cuda", dtype=torch.bfloat16)
    out16.backward(dy)
    g16 = [x.grad.clone(), norm.weight.grad.clone()]
    x.grad = norm.weight.grad = None
    out32.backward(dy.float())
    assert g16[0].dtype == x.grad.dtype == torch.float32
    torch.testing.assert_close(g16[0], x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g16[1], norm.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group_size", [2048, 512])
def test_backward_launcher_matches_mamba_ssm(group_size):
    """Our launch of mamba-ssm's backward kernel (more programs, fewer rows each) gives its launcher's dx and
    dz bit for bit (each row is the same computation) and its weight gradient up to the order of the FP32
    partial sums; rows that no program count divides (1000) included."""
    from nvfp4train.model.fused_norm import rms_norm_backward
    from nvfp4train.model.ops import gated_norm_kernels

    g = torch.Generator(device="cuda").manual_seed(2)
    M, N = 1000, 2048
    x, dy, z = (torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    w = torch.rand(N, device="cuda", generator=g) + 0.5
    z = z if group_size < N else None
    _, _, rstd = gated_norm_kernels()._layer_norm_fwd(
        x, w, None, 1e-5, z=z, group_size=group_size, norm_before_gate=False, is_rms_norm=True
    )
    want_dx, want_dw, _, want_dz = gated_norm_kernels()._layer_norm_bwd(
        dy, x, w, None, 1e-5, None, rstd, z, group_size, False, True
    )
    for warps_per_sm in (4, 32, 10_000):
        dx, dw, dz = rms_norm_backward(dy, x, w, z, rstd, 1e-5, group_size, warps_per_sm=warps_per_sm)
        assert torch.equal(dx, want_dx)
        assert (dz is None) == (z is None) and (dz is None or torch.equal(dz, want_dz))
        torch.testing.assert_close(dw, want_dw, rtol=1e-5, atol=1e-3)
