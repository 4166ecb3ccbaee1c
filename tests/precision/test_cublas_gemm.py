"""The emulated GEMM's cuBLAS path with a device-side output scale (precision/backends/cublas.py): the same
numbers as FP32 GEMM + separate scale-and-cast pass to an FP32 ulp before the output rounding, the scale
read when a CUDA graph replays (not when it was captured), and torch's own GEMMs unaffected afterwards."""

import pytest
import torch

from nvfp4train.precision.backends import cublas, gemm_fp32, scale_and_cast


def test_cpu_operands_keep_the_portable_path():
    a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16)
    assert not cublas.supports(a, b, torch.bfloat16)


@pytest.mark.gpu
def test_the_triton_switch_turns_it_off(monkeypatch):
    if not torch.cuda.is_available() or not cublas.available():
        pytest.skip("needs CUDA and torch's libcublas")
    a, b = _operands(32, 16, 32, seed=3)
    assert cublas.supports(a, b, torch.bfloat16)
    monkeypatch.setenv("NVFP4TRAIN_TRITON", "0")
    assert not cublas.supports(a, b, torch.bfloat16)


def _operands(m, n, k, seed):
    """E2M1 codes times power-of-two block scales: exact in BF16, as the dequantized NVFP4 operands are."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6], device="cuda")

    def make(rows):
        codes = grid[torch.randint(0, len(grid), (rows, k), device="cuda", generator=g)]
        scales = 2.0 ** torch.randint(-6, 6, (rows, k // 16), device="cuda", generator=g).float()
        return (codes * scales.repeat_interleave(16, dim=1)).to(torch.bfloat16)

    return make(m), make(n + 5)[:n]  # b: the first rows of a taller tensor, as Quantized.first_rows gives


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scaled", ["both", "one", "none"])
@pytest.mark.parametrize("layouts", ["row-major", "a column-major", "b column-major"])
def test_scaled_gemm_matches_the_two_pass_epilogue(out_dtype, scaled, layouts):
    if not torch.cuda.is_available() or not cublas.available():
        pytest.skip("needs CUDA and torch's libcublas")
    a, b = _operands(300, 200, 144, seed=0)
    if layouts == "a column-major":
        a = a.t().contiguous().t()
    elif layouts == "b column-major":
        b = b.t().contiguous().t()
    assert cublas.supports(a, b, out_dtype)
    sa = torch.tensor(3.7e-3, device="cuda") if scaled != "none" else None
    sb = torch.tensor(0.0123, device="cuda") if scaled == "both" else None
    alpha = sa * sb if scaled == "both" else sa
    got = cublas.scaled_gemm(a, b, alpha, out_dtype)
    want = scale_and_cast(gemm_fp32(a, b), sa, sb, out_dtype)
    assert got.dtype == out_dtype and got.shape == (300, 200)
    if out_dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2**-22, atol=0)
    else:  # one FP32 ulp apart before rounding to BF16: the same BF16 value but at rounding ties
        ulp = 2.0 ** (torch.floor(torch.log2(want.float().abs().clamp_min(1e-30))) - 7)
        assert ((got.float() - want.float()).abs() <= ulp).all()
        assert (got == want).float().mean() > 0.99


@pytest.mark.gpu
def test_scale_is_read_when_a_cuda_graph_replays():
    if not torch.cuda.is_available() or not cublas.available():
        pytest.skip("needs CUDA and torch's libcublas")
    a, b = _operands(128, 64, 64, seed=1)
    alpha = torch.tensor([0.5], device="cuda")
    cublas.scaled_gemm(a, b, alpha, torch.float32)  # warm-up outside the capture
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = cublas.scaled_gemm(a, b, alpha, torch.float32)
    torch.cuda.current_stream().wait_stream(stream)
    exact = a.double() @ b.double().t()
    for value in (0.25, 3.0):
        alpha.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.double(), exact * value, rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_torch_gemms_unaffected_after_a_call():
    """The handle's pointer mode and math mode are restored: torch's host-scalar alpha still works."""
    if not torch.cuda.is_available() or not cublas.available():
        pytest.skip("needs CUDA and torch's libcublas")
    a, b = _operands(64, 32, 48, seed=2)
    c = torch.zeros(64, 32, device="cuda", dtype=torch.bfloat16)
    before = torch.addmm(c, a, b.t(), alpha=2.0)
    cublas.scaled_gemm(a, b, torch.tensor(3.0, device="cuda"), torch.bfloat16)
    after = torch.addmm(c, a, b.t(), alpha=2.0)
    assert torch.equal(before, after)
    torch.testing.assert_close(after.double(), 2.0 * (a.double() @ b.double().t()), rtol=2**-8, atol=0)
