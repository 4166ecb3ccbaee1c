"""QuantLinear: a bias-free linear layer whose three GEMMs follow a `LayerRecipe`.

    forward   Y  = Q(X) · Q(W)ᵀ                     (fprop_x, fprop_w)
    backward  dX = Q(dY) · Q(W)                     (dgrad_dy, dgrad_w; with a 16x16 weight tile
                                                     the very bits Fprop used, transposed)
              dW = Q(RHT(dYᵀ)) · Q(RHT(Xᵀ))ᵀ        (wgrad_dy, wgrad_x; along tokens)

Emulated GEMM: the operands are dequantized to `code x block scale`, which is exact
in BF16 (and in TF32); the product is accumulated in FP32; the two FP32 global decode scales are
multiplied into the FP32 result afterwards, as the hardware epilogue does; the result is rounded
once to the output dtype (BF16 under autocast). Weight gradients are returned in FP32.

Saved for backward (what the recipe lets us keep instead of a BF16 copy of X): the Wgrad copy of
X, already transformed and quantized along tokens (packed 4-bit codes + scales for NVFP4), and
the packed 2-D weight when Dgrad reuses it. The BF16 copy of X is saved only when the Wgrad X
operand is BF16. `saved_activation_bytes` measures this.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nvfp4train.formats import rounding

from . import operands
from .backends import Backend, get_backend
from .operands import round_up
from .policy import ROLES, LayerRecipe, PrecisionPolicy

log = logging.getLogger(__name__)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype nn.Linear would produce here: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _k_pad(k: int, *specs) -> int:
    return round_up(k, math.lcm(*(s.k_block for s in specs)))


class SRStreams:
    """A layer's stochastic-rounding generators, one per operand role, so toggling SR on one
    operand never shifts the random draws of another. Each is seeded from (seed, stream_base +
    role index), created on first use on the data's device, and checkpointable."""

    def __init__(self, seed: int, stream_base: int, label: str):
        self.seed, self.stream_base, self.label = seed, stream_base, label
        self._generators: dict[str, torch.Generator] = {}
        self._pending_states: dict[str, torch.Tensor] = {}

    def generator(self, role: str, device: torch.device) -> torch.Generator:
        """The SR generator of operand `role` on `device`."""
        gen = self._generators.get(role)
        if gen is None or gen.device.type != device.type:
            gen = rounding.sr_generator(self.seed, self.stream_base + ROLES.index(role), device=device)
            pending = self._pending_states.pop(role, None)
            if pending is not None:
                try:
                    gen.set_state(pending)
                except (RuntimeError, ValueError):
                    # A CPU generator state does not fit a CUDA generator (or vice versa).
                    log.warning("%s/%s: saved SR generator state does not fit a %s generator; "
                                "continuing from the seeded stream", self.label, role, device.type)
            self._generators[role] = gen
        return gen

    def state(self) -> dict[str, torch.Tensor]:
        states = dict(self._pending_states)
        states.update({role: gen.get_state() for role, gen in self._generators.items()})
        return states

    def load_state(self, states: dict[str, torch.Tensor] | None) -> None:
        self._generators = {}  # re-created on the next SR draw, on the data's device
        self._pending_states = dict(states or {})


@dataclass
class OperandQuantizer:
    """Quantizes one layer's GEMM operands by role: its SR streams, its RHT signs, and where its
    telemetry goes (`stats`: role/statistic -> values, or None when off). This, not the layer, is
    what `_QuantLinearFunction` gets."""
    sr: SRStreams
    rht_signs: Any
    stats: dict[str, list[float]] | None

    def _generator(self, role: str, spec, device) -> torch.Generator | None:
        return self.sr.generator(role, device) if spec.rounding == "sr" else None

    def pack(self, role: str, x: torch.Tensor, spec, k_pad: int) -> operands.Packed:
        packed = operands.pack(x, spec, k_pad, self._generator(role, spec, x.device), self.rht_signs)
        if self.stats is not None and not spec.is_bf16:
            for key, value in operands.operand_stats(x, spec, packed, k_pad, self.rht_signs).items():
                self.stats[f"{role}/{key}"].append(value)
        return packed

    def quantize(self, role: str, x: torch.Tensor, spec, k_pad: int) -> operands.Quantized:
        if self.stats is not None and not spec.is_bf16:
            return self.pack(role, x, spec, k_pad).dequantize()
        return operands.fake_quantize(x, spec, k_pad, self._generator(role, spec, x.device), self.rht_signs)


class _QuantLinearFunction(torch.autograd.Function):
    """Y = X Wᵀ with the GEMMs of `recipe` on `backend`. Saves tensors only through
    `save_for_backward` (so saved-tensor hooks see all of them); `ctx` keeps plain data."""

    @staticmethod
    def forward(ctx, x, weight, recipe: LayerRecipe, backend: Backend, quantizer: OperandQuantizer,
                need_backward: bool):
        out_dtype = _compute_dtype(x)
        out_f, in_f = weight.shape
        device = x.device.type
        with torch.autocast(device, enabled=False):
            x2d = x.reshape(-1, in_f)
            tokens = x2d.shape[0]

            # Fprop: Y = Q(X) Q(W)ᵀ, K = in_features.
            k_f = _k_pad(in_f, recipe.fprop_x, recipe.fprop_w)
            if recipe.reuses_fprop_weight:
                # Quantize W once into its storage form: Fprop uses it, Dgrad reuses the same bits.
                w_packed = quantizer.pack("fprop_w", weight, recipe.fprop_w, k_f)
                w_q = w_packed.dequantize()
            else:
                w_packed = None
                w_q = quantizer.quantize("fprop_w", weight, recipe.fprop_w, k_f)
            x_q = quantizer.quantize("fprop_x", x2d, recipe.fprop_x, k_f)
            y = backend.gemm(x_q, w_q.first_rows(out_f)).to(out_dtype)
            y = y.reshape(*x.shape[:-1], out_f)
            if not need_backward:  # inference, or nothing upstream wants a gradient: save nothing
                return y

            # The Wgrad copy of X: transposed [in, tokens], quantized along tokens now, saved packed
            # (only if W wants a gradient); the packed W only if Dgrad runs.
            k_w = _k_pad(tokens, recipe.wgrad_dy, recipe.wgrad_x)
            x_packed = quantizer.pack("wgrad_x", x2d.t(), recipe.wgrad_x, k_w) if ctx.needs_input_grad[1] else None
            if not ctx.needs_input_grad[0]:
                w_packed = None

        ctx.recipe, ctx.backend, ctx.quantizer = recipe, backend, quantizer
        ctx.x_meta = (x.shape, x.dtype, out_dtype, k_w)
        x_tensors = x_packed.tensors if x_packed is not None else ()
        w_tensors = w_packed.tensors if w_packed is not None else ()
        ctx.x_layout = x_packed.layout if x_packed is not None else None
        ctx.w_layout = w_packed.layout if w_packed is not None else None
        ctx.n_x = len(x_tensors)
        ctx.save_for_backward(weight, *x_tensors, *w_tensors)
        return y

    @staticmethod
    def backward(ctx, dy):
        recipe, backend, quantizer = ctx.recipe, ctx.backend, ctx.quantizer
        x_shape, x_dtype, out_dtype, k_w = ctx.x_meta
        weight, *saved = ctx.saved_tensors
        out_f, in_f = weight.shape
        with torch.autocast(dy.device.type, enabled=False):
            dy2d = dy.reshape(-1, out_f)

            dx = None
            if ctx.needs_input_grad[0]:
                # Dgrad: dX = Q(dY) Q(W), K = out_features; W operand is Wᵀ [in, out].
                if recipe.reuses_fprop_weight:
                    w_q = ctx.w_layout.rebuild(saved[ctx.n_x:]).dequantize()
                    # Fprop's padded [out_p, in_p] values, transposed: the same bits.
                    wt_values = w_q.values.t()[:in_f]
                    k_d = max(_k_pad(out_f, recipe.dgrad_dy), wt_values.shape[1])
                    wt_q = operands.Quantized(operands.pad2d(wt_values, in_f, k_d), w_q.decode_scale)
                else:
                    k_d = _k_pad(out_f, recipe.dgrad_dy, recipe.dgrad_w)
                    wt_q = quantizer.quantize("dgrad_w", weight.t(), recipe.dgrad_w, k_d).first_rows(in_f)
                dy_q = quantizer.quantize("dgrad_dy", dy2d, recipe.dgrad_dy, k_d)
                dx = backend.gemm(dy_q, wt_q).to(out_dtype).to(x_dtype).reshape(x_shape)

            dw = None
            if ctx.needs_input_grad[1]:
                # Wgrad: dW = Q(RHT(dYᵀ)) Q(RHT(Xᵀ))ᵀ, K = tokens.
                dyt_q = quantizer.quantize("wgrad_dy", dy2d.t(), recipe.wgrad_dy, k_w)
                xt_q = ctx.x_layout.rebuild(saved[: ctx.n_x]).dequantize().first_rows(in_f)
                dw = backend.gemm(dyt_q, xt_q).to(weight.dtype)
        return dx, dw, None, None, None, None


class QuantLinear(nn.Module):
    """y = x @ weight.T with the GEMM numerics `policy` gives block `block_index`.

    `.weight` is an FP32 [out, in] parameter (the master copy the optimizer owns); every GEMM
    quantizes from it. A layer whose recipe is all-BF16 runs `F.linear` (bit-identical to
    nn.Linear, autocast included). The layer keeps its two `LayerRecipe`s (before and after the
    schedule's switch to BF16), not the policy."""

    def __init__(self, in_features: int, out_features: int, *, policy: PrecisionPolicy, block_index: int,
                 n_blocks: int, name: str, seed: int = 0, backend: Backend | str = "emulated", rht_signs=None,
                 device=None, dtype=torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default; models re-init
        self.block_index, self.n_blocks, self.name = block_index, n_blocks, name
        self.label = f"block{block_index}.{name}"
        self.format = policy.format
        self.backend = get_backend(backend)
        self.rht_signs = rht_signs
        self.sr = SRStreams(seed, (block_index * 8 + _NAME_IDS.get(name, 7)) * 8, self.label)
        self.stats_enabled = False
        self._stats: dict[str, list[float]] = defaultdict(list)
        self.recipes = {switched: policy.layer_recipe(block_index, n_blocks, switched=switched)
                        for switched in (False, True)}
        self.switched = False
        self.recipe = self.recipes[False]

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def extra_repr(self) -> str:
        kind = "bf16" if self.recipe.all_bf16 else self.format
        return f"{self.in_features}, {self.out_features}, {self.label}, {kind}, backend={self.backend.name}, switched={self.switched}"

    # ------------------------------------------------------------------ schedule
    def set_switched(self, switched: bool) -> None:
        self.switched = bool(switched)
        self.recipe = self.recipes[self.switched]

    # ------------------------------------------------------------------ stochastic rounding streams
    def generator_state(self) -> dict[str, torch.Tensor]:
        return self.sr.state()

    def load_generator_state(self, states: dict[str, torch.Tensor] | None) -> None:
        self.sr.load_state(states)

    # ------------------------------------------------------------------ telemetry
    def pop_stats(self) -> dict[str, float]:
        """Mean of each statistic recorded since the last call; clears them."""
        out = {k: sum(v) / len(v) for k, v in self._stats.items() if v}
        self._stats.clear()
        return out

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.all_bf16:
            return F.linear(x, self.weight)
        return self._quantized_forward(x)

    # Under torch.compile (train.compile) the quantized GEMMs run eagerly, so a compiled model
    # keeps eager's bits: inductor's fused FP32 divisions are not bit-exact with TE on CUDA (see
    # formats/compiled.py, the opt-in fast path), and the Function's Python state (SR generators,
    # telemetry) would only graph-break and recompile per input dtype.
    @torch.compiler.disable
    def _quantized_forward(self, x: torch.Tensor) -> torch.Tensor:
        need_backward = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        quantizer = OperandQuantizer(self.sr, self.rht_signs, self._stats if self.stats_enabled else None)
        return _QuantLinearFunction.apply(x, self.weight, self.recipe, self.backend, quantizer, need_backward)


_NAME_IDS = {"in_proj": 0, "out_proj": 1, "qkv": 2, "out": 3, "fc1": 4, "fc2": 5}
