"""GPU checks of the precision backends (marked gpu: skipped without CUDA).

    python -m pytest -q -m gpu tests/gpu/test_precision_gpu.py

1. CUDA == CPU, bit for bit, for the quantized operands of RNE paths (emulated backend): every
   operand the three GEMMs see, per role, RHT'd ones included (formats transforms BF16 inputs
   exactly, in float64, so their bits do not depend on the device's summation order).
2. The CUDA emulated GEMM (BF16 operands, FP32 output) equals an FP64 product of the same operands.
3. scaled_mm (torch._scaled_mm, FP8 tensor cores) against emulated for fp8_tensorwise and
   fp8_blockwise (128x128 and 1x128 weight tiles): the same quantized operands bit for bit; both
   accumulate in FP32, so Y/dX agree to BF16 rounding and dW (FP32) to accumulation order. And
   backend=auto picks scaled_mm for the FP8 policies (or te where installed).
4. torch.compile (inductor) of quantized linears on the GPU gives eager's Y, dX, dW bit for bit.
5. te (when Transformer Engine is installed and runs the recipe here) against emulated: the same
   recipe, different kernels: agree to within a fraction of the format's error.
"""

from __future__ import annotations

import pytest
import torch

from nvfp4train.precision import ROLES, PrecisionPolicy, QuantLinear
from nvfp4train.precision.backends import SCALED_MM, TE, EmulatedBackend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def preset(name: str, **overrides) -> PrecisionPolicy:
    from nvfp4train.config import load_preset

    return PrecisionPolicy.from_dict({**load_preset("precision", name), **overrides})


DEVICE = "cuda"  # the device compared against the CPU


def all_quantized(name: str, **overrides) -> PrecisionPolicy:
    """The preset with no BF16 blocks, so a one-block test layer is quantized."""
    return preset(name, bf16_first=0, bf16_last=0, **overrides)


def layer_on(policy, device, backend="emulated", in_f=256, out_f=192, seed=0):
    layer = QuantLinear(
        in_f, out_f, policy=policy, block_index=0, n_blocks=1, name="fc1", seed=seed, backend=backend
    ).to(device)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        layer.weight.copy_((torch.randn(out_f, in_f, generator=g) * 0.05).to(device))
    return layer


def data(device, tokens=512, in_f=256, out_f=192):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, in_f, generator=g).to(torch.bfloat16)
    grad = torch.randn(tokens, out_f, generator=g).to(torch.bfloat16)
    return x.to(device), grad.to(device)


def run(layer, x, grad):
    x = x.clone().requires_grad_(True)
    layer.weight.grad = None
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = layer(x)
    y.backward(grad.to(y.dtype))
    return y.detach().float(), x.grad.detach().float(), layer.weight.grad.detach().float()


def captured_operands(layer, x, grad):
    calls = []
    backend_class = type(layer.backend)
    real = backend_class.gemm

    def spy(backend, a, b, *args, **kwargs):
        calls.append((a, b))
        return real(backend, a, b, *args, **kwargs)

    backend_class.gemm = spy
    try:
        outputs = run(layer, x, grad)
    finally:
        backend_class.gemm = real
    (fx, fw), (ddy, dw), (wdy, wx) = calls
    ops = dict(zip(ROLES, (fx, fw, ddy, dw, wdy, wx)))
    return ops, outputs


def same_values_up_to_k_padding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same operand values, where one may carry more zero K columns (scaled_mm makes its blockwise operands
    at the K its GEMM wants, backends.gemm_k_multiple)."""
    k = min(a.shape[1], b.shape[1])
    return a.shape[0] == b.shape[0] and torch.equal(a[:, :k], b[:, :k]) and not a[:, k:].any() and not b[:, k:].any()


def rel(a, b) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_cuda_equals_cpu(rows):
    for name in ("nvfp4_no_sr", "nvfp4_rht_everywhere", "mxfp4", "fp8_blockwise", "fp8_tensorwise"):
        policy = all_quantized(name) if name.startswith("fp8") else all_quantized(name, sr="none")
        ops_cpu, _ = captured_operands(layer_on(policy, "cpu"), *data("cpu"))
        ops_gpu, _ = captured_operands(layer_on(policy, DEVICE), *data(DEVICE))
        for role in ROLES:
            a, b = ops_cpu[role], ops_gpu[role]
            diff = float((a.values.cpu() != b.values.cpu()).float().mean())
            scale_ok = (a.decode_scale is None) or torch.equal(a.decode_scale.cpu(), b.decode_scale.cpu())
            rows.append((f"cuda==cpu {name}", role, diff, 0.0, diff == 0.0 and scale_ok))


def check_emulated_gemm_exact(rows):
    for name in ("nvfp4", "mxfp4", "fp8_tensorwise"):
        ops, (y, dx, dw) = captured_operands(layer_on(all_quantized(name), DEVICE), *data(DEVICE))

        def dense(q):
            v = q.values.double()
            return v * q.decode_scale.double() if q.decode_scale is not None else v

        y_exact = dense(ops["fprop_x"]) @ dense(ops["fprop_w"])[:192].t()
        rows.append((f"emulated gemm {name}", "Y vs fp64", rel(y, y_exact), 2**-8, rel(y, y_exact) <= 2**-8))


SCALED_MM_CASES = (("fp8_tensorwise", {}), ("fp8_blockwise", {}), ("fp8_blockwise", {"weight_tile": "1x128"}))


def check_scaled_mm(rows):
    """scaled_mm's operands are the emulated path's, bit for bit; its GEMMs (FP8 tensor cores, FP32
    accumulation) agree with the emulated ones to FP32-accumulation tolerance before the output
    rounding (Y, dX: BF16; dW: FP32)."""
    for name, overrides in SCALED_MM_CASES:
        policy = all_quantized(name, **overrides)
        label = f"scaled_mm vs emulated {name} {policy.resolved_weight_tile}"
        why = SCALED_MM.unsupported(policy)
        if why:
            rows.append((label, f"skipped: {why}", float("nan"), 0.0, True))
            continue
        # in 256, out 192 (128x128 tiles pad W's rows to 256); 200 tokens: M and Wgrad's K padded
        for tokens in (512, 200):
            x, grad = data(DEVICE, tokens=tokens)
            ops_e, emulated = captured_operands(layer_on(policy, DEVICE, "emulated"), x, grad)
            ops_f, fp8 = captured_operands(layer_on(policy, DEVICE, "scaled_mm"), x, grad)
            for role in ROLES:
                a, b = ops_f[role], ops_e[role]
                same = same_values_up_to_k_padding(a.values, b.values) and (
                    (a.decode_scale is None and b.decode_scale is None) or torch.equal(a.decode_scale, b.decode_scale)
                )
                rows.append((f"{label} tokens={tokens}", f"operand {role}", 0.0 if same else 1.0, 0.0, same))
            for out, a, b, limit in zip(("Y", "dX", "dW"), fp8, emulated, (2**-7, 2**-7, 1e-3)):
                err = rel(a, b)
                rows.append((f"{label} tokens={tokens}", out, err, limit, err <= limit))


def check_auto_picks_scaled_mm(rows):
    from nvfp4train.precision.backends import resolve_backend

    for name in ("fp8_tensorwise", "fp8_blockwise"):
        backend, reason = resolve_backend(all_quantized(name))
        cap = torch.cuda.get_device_capability()
        expected = (
            {"te", "scaled_mm"} if cap >= (9, 0) or name == "fp8_tensorwise" and cap >= (8, 9) else {"te", "emulated"}
        )
        ok = backend.name in expected
        # the whole reason when it failed: the 60-character cut hid why scaled_mm's probe refused
        rows.append((f"backend=auto {name}", f"{backend.name}: {reason}"[: None if not ok else 60], 0.0, 0.0, ok))


def check_compiled_equals_eager(rows):
    """torch.compile (inductor) of two quantized linears in a row, on the GPU, with the backend auto
    picks: the custom ops run their eager code inside the graph, so Y, dX and dW are eager's bits."""
    from torch import nn

    from nvfp4train.precision.backends import resolve_backend

    for name in ("nvfp4", "mxfp4", "fp8_tensorwise", "fp8_blockwise"):
        policy = all_quantized(name)
        backend, _ = resolve_backend(policy)
        if backend.name == "te":
            backend = SCALED_MM if not SCALED_MM.unsupported(policy) else EmulatedBackend()
        x, grad = data(DEVICE)
        results = []
        for compiled in (False, True):
            torch.manual_seed(0)
            model = nn.Sequential(
                layer_on(policy, DEVICE, backend.name, 256, 256, seed=3),
                layer_on(policy, DEVICE, backend.name, 256, 192, seed=4),
            )
            forward = torch.compile(model) if compiled else model
            xx = x.clone().requires_grad_(True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = forward(xx)
            y.backward(grad.to(y.dtype))
            results.append((y.detach(), xx.grad, *(layer.weight.grad for layer in model)))
        same = all(torch.equal(a, b) for a, b in zip(*results))
        rows.append((f"compiled == eager {name}", f"backend {backend.name}", 0.0 if same else 1.0, 0.0, same))


def check_te(rows):
    for name in ("fp8_blockwise", "fp8_tensorwise", "nvfp4"):
        policy = all_quantized(name)
        why = TE.unsupported(policy)
        if why:
            rows.append((f"te vs emulated {name}", f"skipped: {why}", float("nan"), 0.0, True))
            continue
        from nvfp4train.precision.backends import TELinear

        x, grad = data(DEVICE)
        emulated_layer = layer_on(policy, DEVICE)
        te_layer = TELinear(256, 192, policy=policy, block_index=0, n_blocks=1, name="fc1").to(DEVICE)
        with torch.no_grad():
            te_layer.weight.copy_(emulated_layer.weight)
        ref = run(emulated_layer, x, grad)
        out = run(te_layer, x, grad)
        limit = 0.05 if name.startswith("fp8") else 0.2
        for label, a, b in zip(("Y", "dX", "dW"), out, ref):
            err = rel(a, b)
            rows.append((f"te vs emulated {name}", label, err, limit, err <= limit))


@pytest.mark.parametrize(
    "check",
    [
        check_cuda_equals_cpu,
        check_emulated_gemm_exact,
        check_scaled_mm,
        check_auto_picks_scaled_mm,
        check_compiled_equals_eager,
        check_te,
    ],
    ids=lambda check: check.__name__,
)
def test_gpu_check(check):
    """Each check appends rows (check, item, value, limit, ok): all must be ok."""
    rows = []
    check(rows)
    bad = [row for row in rows if not row[4]]
    assert rows and not bad, bad
