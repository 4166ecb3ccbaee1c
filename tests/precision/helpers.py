"""Shared helpers for the precision tests."""

from __future__ import annotations

import contextlib

import torch

from nvfp4train.precision import PrecisionPolicy, QuantLinear
from nvfp4train.precision.backends import EmulatedBackend
from nvfp4train.precision.ops import LayerState

PRESETS = (
    "bf16",
    "fp8_blockwise",
    "fp8_tensorwise",
    "nvfp4",
    "nvfp4_no_sr",
    "nvfp4_no_rht",
    "nvfp4_no_2d",
    "nvfp4_all_layers",
    "nvfp4_sr_everywhere",
    "nvfp4_rht_everywhere",
    "mxfp4",
    "nvfp4_4over6",
    "nvfp4_row_scaled",
)

# Each ablation preset against nvfp4: the GEMM operands (roles) it must change, and no others.
ABLATION_CHANGES = [
    ("nvfp4_no_sr", {"dgrad_dy", "wgrad_dy"}),
    ("nvfp4_no_rht", {"wgrad_dy", "wgrad_x"}),
    ("nvfp4_no_2d", {"fprop_w", "dgrad_w"}),
    ("nvfp4_sr_everywhere", {"fprop_x", "fprop_w", "dgrad_w", "wgrad_x"}),
    ("nvfp4_rht_everywhere", {"fprop_x", "fprop_w", "dgrad_dy", "dgrad_w"}),
    ("nvfp4_4over6", {"fprop_w", "dgrad_w"}),
    ("nvfp4_row_scaled", {"fprop_x"}),
]


def load_preset(name: str, **overrides) -> PrecisionPolicy:
    from nvfp4train.config import load_preset as load_config_preset

    return PrecisionPolicy.from_dict({**load_config_preset("precision", name), **overrides})


def make_layer(
    policy: PrecisionPolicy, in_f=64, out_f=48, seed=0, weight_seed=0, block_index=0, n_blocks=1, backend="emulated"
):
    layer = QuantLinear(
        in_f, out_f, policy=policy, block_index=block_index, n_blocks=n_blocks, name="fc1", seed=seed, backend=backend
    )
    g = torch.Generator().manual_seed(weight_seed)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_f, in_f, generator=g) * 0.1)
    return layer


def inputs(tokens=64, in_f=64, out_f=48, seed=1, dtype=torch.bfloat16):
    """x and a fixed upstream gradient G (loss = sum(y * G), so dY = G whatever the forward did)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, in_f, generator=g).to(dtype)
    grad = torch.randn(tokens, out_f, generator=g).to(torch.bfloat16)
    return x, grad


def run(layer, x, grad, autocast=True):
    """Forward + backward; returns (y, dx, dw)."""
    layer.weight.grad = None
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    y.backward(grad.to(y.dtype))
    return y.detach(), x.grad.detach(), layer.weight.grad.detach().clone()


class GemmSpy:
    """Records the operands of every emulated GEMM (in call order: Fprop, Dgrad, Wgrad) as
    FP64 dense tensors with their global decode scales applied."""

    def __init__(self):
        self.calls = []

    @contextlib.contextmanager
    def patch(self, monkeypatch):
        real = EmulatedBackend.gemm

        def spy(backend, a, b, *args, **kwargs):
            self.calls.append((self._dense(a), self._dense(b)))
            return real(backend, a, b, *args, **kwargs)

        monkeypatch.setattr(EmulatedBackend, "gemm", spy)
        yield self
        monkeypatch.setattr(EmulatedBackend, "gemm", real)

    @staticmethod
    def _dense(q):
        v = q.values.double()
        return v * q.decode_scale.double() if q.decode_scale is not None else v

    def operands(self) -> dict[str, torch.Tensor]:
        """The six operands by role (requires exactly one forward + backward)."""
        assert len(self.calls) == 3, f"expected 3 GEMMs (fprop, dgrad, wgrad), saw {len(self.calls)}"
        (fx, fw), (ddy, dw), (wdy, wx) = self.calls
        return {"fprop_x": fx, "fprop_w": fw, "dgrad_dy": ddy, "dgrad_w": dw, "wgrad_dy": wdy, "wgrad_x": wx}


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def count_weight_quantizations(monkeypatch, model) -> list:
    """A list that collects (layer label, role) for every weight operand of `model`'s linears quantized from now
    on (W and Wᵀ from one cast count as W's)."""
    calls, depth, ids = [], [0], {m.layer_id for m in model.modules() if isinstance(m, QuantLinear)}
    for method in ("pack", "quantize", "quantize_with_transpose", "pack_with_transpose"):
        real = getattr(LayerState, method)

        def spy(state, role, *args, real=real):
            depth[0] += 1
            try:
                out = real(state, role, *args)
            finally:
                depth[0] -= 1
            # quantize calls pack when telemetry is on; a pair's None means one by one (counted there)
            if role.endswith("_w") and depth[0] == 0 and out is not None and state.id in ids:
                calls.append((state.sr.label, role))
            return out

        monkeypatch.setattr(LayerState, method, spy)
    return calls
