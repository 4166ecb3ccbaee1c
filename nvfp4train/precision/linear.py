"""QuantLinear: a bias-free linear layer whose three GEMMs follow a `LayerRecipe`.

    forward   Y  = Q(X) · Q(W)ᵀ                     (fprop_x, fprop_w)
    backward  dX = Q(dY) · Q(W)                     (dgrad_dy, dgrad_w; with a 16x16 weight tile
                                                     the very bits Fprop used, transposed)
              dW = Q(RHT(dYᵀ)) · Q(RHT(Xᵀ))ᵀ        (wgrad_dy, wgrad_x; along tokens)

Emulated GEMM: the operands are dequantized to `code x block scale`, which is exact
in BF16 (and in TF32); the product is accumulated in FP32; the two FP32 global decode scales are
multiplied into the FP32 result afterwards, as the hardware epilogue does; the result is rounded
once to the output dtype. Under autocast X is first cast to the autocast dtype (BF16), as F.linear
and TE's linear do, and Y comes out in it; weight gradients are returned in FP32.

Saved for backward (what the recipe lets us keep instead of a BF16 copy of X): the Wgrad copy of
X, already transformed and quantized along tokens (packed 4-bit codes + scales for NVFP4), and
the packed 2-D weight when Dgrad reuses it. The BF16 copy of X is saved only when the Wgrad X
operand is BF16. `saved_activation_bytes` measures this.

The three GEMMs are custom ops (`torch.ops.nvfp4train.quant_linear_{fprop,dgrad,wgrad}`, with
fake and autograd registrations), so `torch.compile` traces a model through its quantized linears
without a graph break and runs the ops' eager code inside the compiled graph (the same bits).
They take the recipe as a string and the layer's `LayerState` (SR streams, RHT signs, telemetry,
weight cache) by an int id. Quantized weight operands are cached per layer between the
controller's invalidations (`WeightCache`): one quantization per optimizer step, not one per
micro-batch and per GEMM. Where the recipe pairs an activation's (or a gradient's) two operands
(`operands.fprop_and_wgrad_x`, `operands.dy_pair`), both come from one read of the tensor; the
backward's pair is made by a fourth op, `quant_linear_dy`, and handed to the Dgrad and Wgrad ops.
"""
from __future__ import annotations

import itertools
import logging
import math
import weakref
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nvfp4train.formats import rounding

from . import operands
from .backends import Backend, gemm_k_multiple, get_backend, pad_fp8_k
from .operands import round_up
from .policy import ROLES, LayerRecipe, PrecisionPolicy

log = logging.getLogger(__name__)


def _k_pad(k: int, *specs) -> int:
    return round_up(k, math.lcm(*(s.k_block for s in specs)))


def _fprop_k(in_f: int, recipe: LayerRecipe, backend_name: str) -> int:
    """Fprop's K (in_features padded): a multiple of both operands' blocks, and of the K multiple the
    backend's GEMM wants of these operands (`backends.gemm_k_multiple`), so they are made at that width
    once instead of padded again at every GEMM."""
    return round_up(_k_pad(in_f, recipe.fprop_x, recipe.fprop_w),
                    gemm_k_multiple(backend_name, recipe.fprop_x, recipe.fprop_w))


def _dgrad_k(out_f: int, recipe: LayerRecipe, backend_name: str) -> int:
    """Dgrad's K (out_features padded), as `_fprop_k`. A reused Fprop weight brings its own K padding."""
    specs = (recipe.dgrad_dy,) if recipe.reuses_fprop_weight else (recipe.dgrad_dy, recipe.dgrad_w)
    return round_up(_k_pad(out_f, *specs), gemm_k_multiple(backend_name, recipe.dgrad_dy, recipe.dgrad_w))


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


class WeightCache:
    """A layer's quantized weight operands, kept from one use to the next while the weight stays
    the same: built by the first training forward after an invalidation, reused by the other
    micro-batches' forwards and by every Dgrad, instead of quantizing the FP32 master weight again.

    An entry is dropped when the weight's version counter, storage, shape, dtype or device changes
    (an in-place update, a copy into it, `.data` replaced) and on `clear()`, which the precision
    controller calls at each `on_step` and `weights_changed`, and the TorchEngine after each
    optimizer step: updates that do not bump the version counter (torch's fused AdamW, DeepSpeed
    writing through `.data`, FSDP2 re-gathering into the same storage) are only seen that way.
    Stochastically rounded weight operands are never cached (each use draws anew, as before)."""

    def __init__(self):
        self.enabled = False  # set by PrecisionController: it owns the invalidation schedule
        # FSDP2 gathers the weight into fresh storage at every forward (and, resharded, again in
        # backward): with the storage in the stamp each micro-batch would quantize again. The engine
        # that wraps the model in FSDP2 turns this on, its optimizer-step hook clearing the entries.
        self.until_cleared = False
        self._stamp: tuple | None = None
        self._entries: dict[tuple, Any] = {}

    def _stamp_of(self, weight: torch.Tensor) -> tuple:
        if self.until_cleared:
            return (tuple(weight.shape), weight.dtype, weight.device)
        return (weight._version, weight.data_ptr(), tuple(weight.shape), weight.dtype, weight.device)

    def get(self, key: tuple, weight: torch.Tensor, build, training: bool = True):
        """`build()`, or its result from an earlier call with the same `key` and weight. Only
        training passes use the cache (`training`: a forward that saves for backward, or a
        backward): an evaluation forward between `optimizer.step()` and the next invalidation
        quantizes afresh."""
        if not (self.enabled and training):
            return build()
        stamp = self._stamp_of(weight)
        if stamp != self._stamp:
            self._entries.clear()
            self._stamp = stamp
        if key not in self._entries:
            self._entries[key] = build()
        return self._entries[key]

    def peek(self, key: tuple, weight: torch.Tensor):
        """The entry `get` would return for `key` and this weight, or None (nothing is built)."""
        if not self.enabled or self._stamp != self._stamp_of(weight):
            return None
        return self._entries.get(key)

    def clear(self) -> None:
        self._entries.clear()
        self._stamp = None


def invalidate_weight_caches(layers) -> None:
    """Drop the cached quantized weights of every QuantLinear in `layers` (the weights changed)."""
    for layer in layers:
        if isinstance(layer, QuantLinear):
            layer.invalidate_weight_cache()


class LayerState:
    """What a layer's custom ops need beyond tensors and constants: its SR streams, RHT signs,
    telemetry sink (`stats`, None when off) and weight cache. Registered under the int `id` the
    ops take (custom ops cannot take Python objects); the layer owns it, the registry holds it
    weakly."""

    def __init__(self, sr: SRStreams, rht_signs):
        self.sr = sr
        self.rht_signs = rht_signs if not isinstance(rht_signs, torch.Tensor) else tuple(rht_signs.tolist())
        self.stats: dict[str, list[float]] | None = None
        self.weights = WeightCache()
        self.id = next(_STATE_IDS)
        _STATES[self.id] = self

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

    def quantize_with_transpose(self, role: str, x: torch.Tensor, spec, k_row: int, k_col: int):
        """(Q(x), Q(xᵀ)) for a per-tensor FP8 spec from one cast (`operands.tensorwise_rowcol`: xᵀ's codes are
        x's transposed), or None where that does not apply (padding; or telemetry, which wants each operand's
        own statistics: quantize them separately then)."""
        if self.stats is not None:
            return None
        both = operands.tensorwise_rowcol(x, spec, k_row, k_col)
        return None if both is None else (both[0], both[1].dequantize())


_STATES: "weakref.WeakValueDictionary[int, LayerState]" = weakref.WeakValueDictionary()
_STATE_IDS = itertools.count()


def _state(layer_id: int) -> LayerState:
    try:
        return _STATES[layer_id]
    except KeyError:
        raise RuntimeError(f"quantized linear: no live layer has id {layer_id} (was the layer deleted?)") from None


# ---------------------------------------------------------------------------------- the GEMMs
# Three custom ops, one per GEMM, so torch.compile traces a model around them without a graph
# break (each is one opaque node; dynamo never runs its Python). They take the recipe as a string
# (`LayerRecipe.key()`), the backend by name and the layer's `LayerState` by id. SR generators
# advance inside the ops, at run time, in the same order eager runs them, so a compiled model
# draws the same bits as an eager one and the generator states stay what `state_dict` saves.

def _fprop_weight(state: LayerState, weight: torch.Tensor, recipe: LayerRecipe, backend: Backend, k_f: int,
                  training: bool):
    """(W operand of Fprop, its packed form when Dgrad reuses it, Dgrad's Wᵀ operand when the same cast made
    it), cached per weight version."""
    spec = recipe.fprop_w

    def build():
        if recipe.reuses_fprop_weight:
            # Quantize W once into its storage form: Fprop uses it, Dgrad reuses the same bits.
            packed = state.pack("fprop_w", weight, spec, k_f)
            return packed.dequantize(), packed, None
        if training and state.weights.enabled and operands.tensorwise_pair(spec, recipe.dgrad_w):
            # Per-tensor FP8: Dgrad's Wᵀ is W's codes transposed. One cast writes both; Dgrad finds its
            # operand in this cache entry (without the cache it quantizes Wᵀ itself).
            out_f = weight.shape[0]
            both = state.quantize_with_transpose("fprop_w", weight, spec, k_f,
                                                 _dgrad_k(out_f, recipe, backend.name))
            if both is not None:
                return both[0], None, both[1]
        return state.quantize("fprop_w", weight, spec, k_f), None, None

    if spec.rounding == "sr":
        return build()
    return state.weights.get(("fprop", recipe.key(), backend.name, k_f), weight, build, training)


def _transposed_weight(w_q: operands.Quantized, in_f: int, k_d: int) -> operands.Quantized:
    """Fprop's padded [out_p, in_p] W operand as Dgrad's [in, K = out] operand (K zero-padded to k_d):
    the same bits."""
    if w_q.fp8_scales is not None:  # blockwise FP8, 128x128 tiles: the tiles transposed
        data, scales = pad_fp8_k(w_q.fp8_data.t(), w_q.fp8_scales.t(), k_d)
        return operands.Quantized(None, None, data.contiguous(), scales.contiguous(), w_q.spec, rows=in_f)
    wt_values = w_q.values.t()[:in_f]
    k_d = max(k_d, wt_values.shape[1])
    return operands.Quantized(operands.pad2d(wt_values, in_f, k_d), w_q.decode_scale)


def _saves_x_copy(recipe: LayerRecipe, x_dtype: torch.dtype) -> bool:
    """Whether Fprop returns a copy of X for Wgrad: a quantized one, or a BF16 copy of a non-BF16 X
    (a BF16 X is saved as it is)."""
    return not recipe.wgrad_x.is_bf16 or x_dtype != torch.bfloat16


def _wgrad_x_shape(recipe: LayerRecipe, in_f: int, tokens) -> tuple:
    """The prepared shape of the Wgrad X operand Xᵀ [in, tokens] (rows tile-padded, K = tokens padded)."""
    if recipe.wgrad_x.is_bf16:
        return (tokens, in_f)  # the BF16 copy is kept untransposed and unpadded
    return (round_up(in_f, recipe.wgrad_x.row_block), _k_pad(tokens, recipe.wgrad_dy, recipe.wgrad_x))


@torch.library.custom_op("nvfp4train::quant_linear_fprop", mutates_args=())
def quant_linear_fprop(x: torch.Tensor, weight: torch.Tensor, layer_id: int, recipe_key: str, backend_name: str,
                       out_dtype: torch.dtype, save_x: bool, save_w: bool) -> list[torch.Tensor]:
    """[Y = Q(X) Q(W)ᵀ, *the Wgrad copy of X (packed) if save_x, *the packed W if save_w and Dgrad
    reuses it]. Y is in `out_dtype`; every tensor is new and contiguous."""
    state, recipe, backend = _state(layer_id), LayerRecipe.from_key(recipe_key), get_backend(backend_name)
    out_f, in_f = weight.shape
    with torch.autocast(x.device.type, enabled=False):
        x2d = x.reshape(-1, in_f)
        k_f = _fprop_k(in_f, recipe, backend_name)
        w_q, w_packed, _ = _fprop_weight(state, weight, recipe, backend, k_f, training=save_x or save_w)
        saves_xt = save_x and _saves_x_copy(recipe, x.dtype) and not recipe.wgrad_x.is_bf16
        k_w = _k_pad(x2d.shape[0], recipe.wgrad_dy, recipe.wgrad_x)
        # Fprop's X and the Wgrad Xᵀ from one read of X where the recipe allows (telemetry wants each alone)
        both = (operands.fprop_and_wgrad_x(x2d, recipe.fprop_x, recipe.wgrad_x, k_f, k_w, state.rht_signs)
                if saves_xt and state.stats is None else None)
        x_q = both[0] if both else state.quantize("fprop_x", x2d, recipe.fprop_x, k_f)
        y = backend.gemm(x_q, w_q.first_rows(out_f), out_dtype).reshape(*x.shape[:-1], out_f)
        outputs = [y]
        if save_x and _saves_x_copy(recipe, x.dtype):
            if recipe.wgrad_x.is_bf16:
                outputs.append(x2d.to(torch.bfloat16))
            elif both:
                outputs.extend(both[1].tensors)
            else:  # Xᵀ [in, tokens], quantized along tokens now, saved packed
                outputs.extend(state.pack("wgrad_x", x2d.t(), recipe.wgrad_x, k_w).tensors)
        if save_w and w_packed is not None:
            outputs.extend(t.clone() for t in w_packed.tensors)  # the cache keeps its own
    return [t.contiguous() for t in outputs]


@quant_linear_fprop.register_fake
def _(x, weight, layer_id, recipe_key, backend_name, out_dtype, save_x, save_w):
    recipe = LayerRecipe.from_key(recipe_key)
    out_f, in_f = weight.shape
    outputs = [x.new_empty((*x.shape[:-1], out_f), dtype=out_dtype)]
    storage = []
    if save_x and _saves_x_copy(recipe, x.dtype):
        tokens = x.numel() // in_f
        storage += operands.packed_shapes(recipe.wgrad_x, _wgrad_x_shape(recipe, in_f, tokens))
    if save_w and recipe.reuses_fprop_weight:
        k_f = _fprop_k(in_f, recipe, backend_name)
        storage += operands.packed_shapes(recipe.fprop_w, (round_up(out_f, recipe.fprop_w.row_block), k_f))
    return outputs + [x.new_empty(shape, dtype=dtype) for shape, dtype in storage]


@torch.library.custom_op("nvfp4train::quant_linear_dgrad", mutates_args=())
def quant_linear_dgrad(dy: torch.Tensor, weight: torch.Tensor, w_saved: list[torch.Tensor], layer_id: int,
                       recipe_key: str, backend_name: str, x_dtype: torch.dtype,
                       dy_q: list[torch.Tensor]) -> torch.Tensor:
    """dX = Q(dY) Q(W), K = out_features, in dY's dtype then `x_dtype`. `w_saved`: the packed
    Fprop W when Dgrad reuses it (used when the weight cache does not hold it). `dy_q`: Q(dY) already
    made by quant_linear_dy (two tensors, `operands.operand_tensors`), or empty: quantized here."""
    state, recipe, backend = _state(layer_id), LayerRecipe.from_key(recipe_key), get_backend(backend_name)
    out_f, in_f = weight.shape
    with torch.autocast(dy.device.type, enabled=False):
        dy2d = dy.reshape(-1, out_f)
        k_d, k_f = _dgrad_k(out_f, recipe, backend_name), _fprop_k(in_f, recipe, backend_name)
        if recipe.reuses_fprop_weight:

            def build():
                cached = state.weights.peek(("fprop", recipe_key, backend.name, k_f), weight)
                if cached is not None:
                    w_q = cached[0]
                else:  # Fprop's bits, from what it saved
                    layout = operands.PackedLayout(recipe.fprop_w, (round_up(out_f, recipe.fprop_w.row_block), k_f))
                    w_q = layout.rebuild(w_saved).dequantize()
                return _transposed_weight(w_q, in_f, k_d)
        else:
            def build():
                cached = state.weights.peek(("fprop", recipe_key, backend.name, k_f), weight)
                if cached is not None and cached[2] is not None:  # Wᵀ from Fprop's cast (per-tensor FP8)
                    return cached[2]
                return state.quantize("dgrad_w", weight.t(), recipe.dgrad_w, k_d).first_rows(in_f)
        if recipe.dgrad_w.rounding == "sr":
            wt_q = build()
        else:
            wt_q = state.weights.get(("dgrad", recipe_key, backend.name, k_d), weight, build)
        dy_op = operands.ready_operand(dy_q, recipe.dgrad_dy) if dy_q else state.quantize("dgrad_dy", dy2d,
                                                                                          recipe.dgrad_dy, k_d)
        dx = backend.gemm(dy_op, wt_q, dy.dtype).to(x_dtype)
    return dx.reshape(*dy.shape[:-1], in_f).contiguous()


@quant_linear_dgrad.register_fake
def _(dy, weight, w_saved, layer_id, recipe_key, backend_name, x_dtype, dy_q):
    return dy.new_empty((*dy.shape[:-1], weight.shape[1]), dtype=x_dtype)


@torch.library.custom_op("nvfp4train::quant_linear_wgrad", mutates_args=())
def quant_linear_wgrad(dy: torch.Tensor, x_saved: list[torch.Tensor], layer_id: int, recipe_key: str,
                       backend_name: str, in_features: int, out_dtype: torch.dtype,
                       dy_q: list[torch.Tensor]) -> torch.Tensor:
    """dW = Q(RHT(dYᵀ)) Q(RHT(Xᵀ))ᵀ, K = tokens, in `out_dtype` (the weight's). `x_saved`: what
    Fprop saved of X (packed Xᵀ, or X in BF16). `dy_q`: Q(RHT(dYᵀ)) already made by quant_linear_dy
    (two tensors, `operands.operand_tensors`), or empty: quantized here."""
    state, recipe, backend = _state(layer_id), LayerRecipe.from_key(recipe_key), get_backend(backend_name)
    out_f = dy.shape[-1]
    with torch.autocast(dy.device.type, enabled=False):
        dy2d = dy.reshape(-1, out_f)
        tokens = dy2d.shape[0]
        k_w = _k_pad(tokens, recipe.wgrad_dy, recipe.wgrad_x)
        dyt_q = (operands.ready_operand(dy_q, recipe.wgrad_dy) if dy_q
                 else state.quantize("wgrad_dy", dy2d.t(), recipe.wgrad_dy, k_w))
        if recipe.wgrad_x.is_bf16:
            xt_q = state.quantize("wgrad_x", x_saved[0].reshape(-1, in_features).t(), recipe.wgrad_x, k_w)
        else:
            layout = operands.PackedLayout(recipe.wgrad_x, _wgrad_x_shape(recipe, in_features, tokens))
            xt_q = layout.rebuild(x_saved).dequantize().first_rows(in_features)
        dw = backend.gemm(dyt_q, xt_q, out_dtype)
    return dw.contiguous()


@quant_linear_wgrad.register_fake
def _(dy, x_saved, layer_id, recipe_key, backend_name, in_features, out_dtype, dy_q):
    return dy.new_empty((dy.shape[-1], in_features), dtype=out_dtype)


@torch.library.custom_op("nvfp4train::quant_linear_dy", mutates_args=())
def quant_linear_dy(dy: torch.Tensor, layer_id: int, recipe_key: str, backend_name: str) -> list[torch.Tensor]:
    """Both gradient operands of a layer whose recipe has `operands.dy_pair`, two tensors each
    (`operands.operand_tensors`: NVFP4 dense values + decode scale, FP8 data + block scales), from one
    read of dY where `operands.dgrad_and_wgrad_dy` can (the bits of the two separate quantizations);
    quantized one after the other otherwise, and on steps that record telemetry."""
    state, recipe = _state(layer_id), LayerRecipe.from_key(recipe_key)
    out_f = dy.shape[-1]
    with torch.autocast(dy.device.type, enabled=False):
        dy2d = dy.reshape(-1, out_f)
        k_d = _dgrad_k(out_f, recipe, backend_name)
        k_w = _k_pad(dy2d.shape[0], recipe.wgrad_dy, recipe.wgrad_x)
        both = None
        if state.stats is None:
            both = operands.dgrad_and_wgrad_dy(dy2d, recipe.dgrad_dy, recipe.wgrad_dy, k_d, k_w, state.rht_signs,
                                               state._generator("dgrad_dy", recipe.dgrad_dy, dy.device),
                                               state._generator("wgrad_dy", recipe.wgrad_dy, dy.device))
        if both is None:
            both = (state.quantize("dgrad_dy", dy2d, recipe.dgrad_dy, k_d),
                    state.quantize("wgrad_dy", dy2d.t(), recipe.wgrad_dy, k_w))
    return [t.contiguous() for q, spec in zip(both, (recipe.dgrad_dy, recipe.wgrad_dy))
            for t in operands.operand_tensors(q, spec)]


@quant_linear_dy.register_fake
def _(dy, layer_id, recipe_key, backend_name):
    recipe = LayerRecipe.from_key(recipe_key)
    out_f = dy.shape[-1]
    tokens = dy.numel() // out_f
    k_d = _dgrad_k(out_f, recipe, backend_name)
    k_w = _k_pad(tokens, recipe.wgrad_dy, recipe.wgrad_x)
    shapes = [(recipe.dgrad_dy, (tokens, k_d)), (recipe.wgrad_dy, (round_up(out_f, recipe.wgrad_dy.row_block), k_w))]
    out = []
    for spec, shape in shapes:
        if spec.format.startswith("fp8"):  # raw form: data and block scales
            out += [dy.new_empty(s, dtype=d) for s, d in operands.packed_shapes(spec, shape)]
        else:  # dense values and the global decode scale
            out += [dy.new_empty(shape, dtype=torch.bfloat16), dy.new_empty((), dtype=torch.float32)]
    return out


def _setup_context(ctx, inputs, output):
    x, weight, layer_id, recipe_key, backend_name, out_dtype, save_x, save_w = inputs
    recipe = LayerRecipe.from_key(recipe_key)
    n_x = len(output) - 1
    if save_w and recipe.reuses_fprop_weight:
        n_x -= len(operands.packed_shapes(recipe.fprop_w, (1, 1)))
    x_saved = list(output[1:1 + n_x]) if n_x else ([x] if save_x else [])
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(weight, *x_saved, *output[1 + n_x:])
    ctx.n_x = len(x_saved)
    ctx.args = (layer_id, recipe_key, backend_name)
    ctx.x_dtype = x.dtype


def _backward(ctx, grads):
    dy = grads[0]
    weight, *saved = ctx.saved_tensors
    layer_id, recipe_key, backend_name = ctx.args
    dx = dw = None
    recipe = LayerRecipe.from_key(recipe_key)
    # Both gradient operands from one read of dY when both GEMMs run (a lone Dgrad or Wgrad quantizes
    # only its own, so the other role's SR stream does not advance)
    dy_q = (quant_linear_dy(dy, layer_id, recipe_key, backend_name)
            if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and operands.dy_pair(recipe.dgrad_dy, recipe.wgrad_dy)
            else [])
    if ctx.needs_input_grad[0]:
        dx = quant_linear_dgrad(dy, weight, saved[ctx.n_x:], layer_id, recipe_key, backend_name, ctx.x_dtype,
                                dy_q[:2])
    if ctx.needs_input_grad[1]:
        dw = quant_linear_wgrad(dy, saved[: ctx.n_x], layer_id, recipe_key, backend_name, weight.shape[1],
                                weight.dtype, dy_q[2:])
    return dx, dw, None, None, None, None, None, None


quant_linear_fprop.register_autograd(_backward, setup_context=_setup_context)


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
        self.sr = SRStreams(seed, (block_index * 8 + _NAME_IDS.get(name, 7)) * 8, self.label)
        self._state = LayerState(self.sr, rht_signs)
        self.layer_id = self._state.id  # what the custom ops get
        self._stats: dict[str, list[float]] = defaultdict(list)
        self.recipes = {switched: policy.layer_recipe(block_index, n_blocks, switched=switched)
                        for switched in (False, True)}
        self.switched = False
        self.recipe = self.recipes[False]

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def recipe(self) -> LayerRecipe:
        return self._recipe

    @recipe.setter
    def recipe(self, recipe: LayerRecipe) -> None:
        # The forward reads plain attributes (a bool, a string): cheap for dynamo to guard on.
        self._recipe, self.recipe_key, self.quantized = recipe, recipe.key(), not recipe.all_bf16
        self._state.weights.clear()

    @property
    def stats_enabled(self) -> bool:
        return self._state.stats is not None

    @stats_enabled.setter
    def stats_enabled(self, enabled: bool) -> None:
        self._state.stats = self._stats if enabled else None

    @property
    def cache_weights(self) -> bool:
        """Whether quantized weight operands are kept between uses (see `WeightCache`)."""
        return self._state.weights.enabled

    @cache_weights.setter
    def cache_weights(self, enabled: bool) -> None:
        self._state.weights.enabled = bool(enabled)
        self._state.weights.clear()

    def keep_weight_cache_until_cleared(self) -> None:
        """Key the cached weight operands on the step alone, not on the weight's storage: for a weight
        that FSDP2 gathers afresh at every use, unchanged until the next `invalidate_weight_cache`."""
        self._state.weights.until_cleared = True
        self._state.weights.clear()

    def invalidate_weight_cache(self) -> None:
        """Forget the quantized weight operands (the weight changed, or memory is wanted back)."""
        self._state.weights.clear()

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
        if not self.quantized:
            return F.linear(x, self.weight)
        # Save for backward only what backward will compute from (nothing under no_grad).
        grad = torch.is_grad_enabled()
        save_x = grad and self.weight.requires_grad
        save_w = grad and x.requires_grad
        if torch.is_autocast_enabled(x.device.type):
            # As F.linear under autocast (and TE's linear): the GEMM's input is X in the autocast dtype.
            # The cast is a traced op, so the compiler fuses it into X's producer (an FP32 norm or
            # squared-ReLU output), the quantizers read 2-byte X, and Dgrad's dX comes back in that
            # dtype, widened by the cast's own backward where the producer wants FP32.
            x = x.to(torch.get_autocast_dtype(x.device.type))
        outputs = quant_linear_fprop(x, self.weight, self.layer_id, self.recipe_key, self.backend.name,
                                     x.dtype, save_x, save_w)
        return outputs[0]


_NAME_IDS = {"in_proj": 0, "out_proj": 1, "qkv": 2, "out": 3, "fc1": 4, "fc2": 5}
