"""The quantized linear's custom ops and autograd: the three GEMMs (`torch.ops.nvfp4train.quant_linear_{fprop,
dgrad,wgrad}`) and the gradient pair (`quant_linear_dy`), with fake and autograd registrations, so
`torch.compile` traces a model through its quantized linears without a graph break and runs the ops' eager
code inside the compiled graph (the same bits).

Custom ops take tensors, numbers and strings only. Two things cross that line here, and only here:

* the recipe, as a string: `encode_recipe` writes a `LayerRecipe` as one, `decode_recipe` reads it back
  (cached: one parse per distinct recipe);
* the layer's `LayerState` (SR streams, RHT signs, telemetry sink, weight cache), as an int id into the
  registry below. The registry is the one global: an op cannot take a module, and what it needs from the
  layer (generators that advance, a cache that fills) must be reached at run time, also when the op runs
  inside a compiled graph or a CUDA graph's capture, so a lookup by a constant id is what remains. The layer
  owns its state; the registry holds it weakly, and nothing but `LayerState` writes to it.

SR generators advance inside the ops, at run time, in the same order eager runs them, so a compiled model
draws the same bits as an eager one and the generator states stay what `state_dict` saves.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import weakref

import torch

from nvfp4train.formats import activation

from . import operands, pairs
from .backends import Backend, gemm_k_multiple, gemm_out_width, get_backend, pad_fp8_k
from .operands import round_up
from .recipe import DEQUANTIZED, ROLES, LayerRecipe, OperandSpec


# ---------------------------------------------------------------------------------- the recipe codec
def encode_operand(spec: OperandSpec) -> str:
    """The spec as a short string, e.g. "nvfp4,16x16,rne,0," (`decode_operand` inverts it)."""
    tile = "-" if spec.tile is None else f"{spec.tile[0]}x{spec.tile[1]}"
    key = f"{spec.format},{tile},{spec.rounding},{spec.rht_dim},{spec.scale_mode}"
    if spec.four_over_six or spec.row_scaled:  # TE's options: three more fields
        key += f",{spec.four_over_six},{spec.scale_bound},{int(spec.row_scaled)}"
    return key


def decode_operand(key: str) -> OperandSpec:
    fields = key.split(",")
    fmt, tile, rounding, rht_dim, scale_mode = fields[:5]
    extra = {}
    if len(fields) == 8:
        extra = {"four_over_six": fields[5], "scale_bound": int(fields[6]), "row_scaled": fields[7] == "1"}
    return OperandSpec(
        fmt,
        None if tile == "-" else tuple(int(v) for v in tile.split("x")),
        rounding,
        int(rht_dim),
        scale_mode,
        **extra,
    )


def encode_recipe(recipe: LayerRecipe) -> str:
    """The recipe as the one string the custom ops take; `decode_recipe` inverts it."""
    return ";".join(encode_operand(getattr(recipe, r)) for r in ROLES)


@functools.cache
def decode_recipe(key: str) -> LayerRecipe:
    return LayerRecipe(*(decode_operand(k) for k in key.split(";")))


# ---------------------------------------------------------------------------------- layer state
# The GEMMs' padded sizes are pure functions of (size, recipe, backend), asked for at every op call: each is
# computed once. A step runs four ops per quantized linear without a CUDA graph (DDP, FSDP2), and their host
# time adds up to a GPU's time a step.
@functools.lru_cache(maxsize=4096)
def _k_pad(k: int, *specs) -> int:
    return round_up(k, math.lcm(*(s.k_block for s in specs)))


@functools.lru_cache(maxsize=4096)
def _fprop_k(in_f: int, recipe: LayerRecipe, backend_name: str) -> int:
    """Fprop's K (in_features padded): a multiple of both operands' blocks, and of the K multiple the
    backend's GEMM wants of these operands (`backends.gemm_k_multiple`), so they are made at that width
    once instead of padded again at every GEMM."""
    return round_up(
        _k_pad(in_f, recipe.fprop_x, recipe.fprop_w), gemm_k_multiple(backend_name, recipe.fprop_x, recipe.fprop_w)
    )


@functools.lru_cache(maxsize=4096)
def _dgrad_k(out_f: int, recipe: LayerRecipe, backend_name: str) -> int:
    """Dgrad's K (out_features padded), as `_fprop_k`. A reused Fprop weight brings its own K padding."""
    specs = (recipe.dgrad_dy,) if recipe.reuses_fprop_weight else (recipe.dgrad_dy, recipe.dgrad_w)
    return round_up(_k_pad(out_f, *specs), gemm_k_multiple(backend_name, recipe.dgrad_dy, recipe.dgrad_w))


class LayerState:
    """What a layer's custom ops need beyond tensors and constants: its SR streams, RHT signs (a host tuple
    of ±1.0: the layer's `rht_signs` buffer, read when built or loaded), telemetry sink (`stats`, None when
    off) and weight cache. Registered under the int `id` the ops take (custom ops cannot take Python
    objects); the layer owns it, the registry holds it weakly."""

    def __init__(self, sr, rht_signs: tuple[float, ...], weights):
        self.sr = sr  # linear.SRStreams
        self.rht_signs = rht_signs
        self.stats: dict[str, list[float]] | None = None
        self.weights = weights  # linear.WeightCache, owned by the layer
        self.id = next(_STATE_IDS)
        _STATES[self.id] = self

    def sr_generator(self, role: str, spec, device) -> torch.Generator | None:
        return self.sr.generator(role, device) if spec.rounding == "sr" else None

    def pack(self, role: str, x: torch.Tensor, spec, k_pad: int) -> operands.Packed:
        packed = operands.pack(x, spec, k_pad, self.sr_generator(role, spec, x.device), self.rht_signs)
        if self.stats is not None and not spec.is_bf16:
            for key, value in operands.operand_stats(x, spec, packed, k_pad, self.rht_signs).items():
                self.stats[f"{role}/{key}"].append(value)
        return packed

    def quantize(self, role: str, x: torch.Tensor, spec, k_pad: int) -> operands.Quantized:
        if self.stats is not None and not spec.is_bf16:
            return self.pack(role, x, spec, k_pad).dequantize()
        return operands.fake_quantize(x, spec, k_pad, self.sr_generator(role, spec, x.device), self.rht_signs)

    def quantize_with_transpose(self, role: str, x: torch.Tensor, spec, k_row: int, k_col: int):
        """(Q(x), Q(xᵀ)) for a per-tensor FP8 spec from one cast (`pairs.tensorwise_rowcol`: xᵀ's codes are
        x's transposed), or None where that does not apply (padding; or telemetry, which wants each operand's
        own statistics: quantize them separately then)."""
        if self.stats is not None:
            return None
        both = pairs.tensorwise_rowcol(x, spec, k_row, k_col)
        return None if both is None else (both[0], both[1].dequantize())

    def quantize_weight_pair(self, role: str, w: torch.Tensor, spec, k_row: int, k_col: int):
        """(Q(W), Q(Wᵀ)) of a 4over6 weight with 16x16 tiles from one pass (`pairs.weight_pair`: two copies that
        choose their candidates separately, as TE's rowwise and columnwise ones), or None where that does not
        apply (another spec; telemetry, which records each operand's own statistics: quantize them separately)."""
        if self.stats is not None:
            return None
        return pairs.weight_pair(w, spec, k_row, k_col)

    def pack_with_transpose(self, role: str, w: torch.Tensor, spec, k_row: int, k_col: int):
        """(packed W, Q(Wᵀ)) of a 128x128-tiled FP8 weight from one pass (`pairs.weight_and_transpose`: Wᵀ's
        tiles are W's transposed), or None where that does not apply (another spec; telemetry, which records
        `pack`'s statistics: quantize W alone then)."""
        if self.stats is not None:
            return None
        return pairs.weight_and_transpose(w, spec, k_row, k_col)


_STATES: weakref.WeakValueDictionary[int, LayerState] = weakref.WeakValueDictionary()
_STATE_IDS = itertools.count()


def _state(layer_id: int) -> LayerState:
    try:
        return _STATES[layer_id]
    except KeyError:
        raise RuntimeError(f"quantized linear: no live layer has id {layer_id} (was the layer deleted?)") from None


# ---------------------------------------------------------------------------------- the GEMMs
# Three custom ops, one per GEMM, so torch.compile traces a model around them without a graph
# break (each is one opaque node; dynamo never runs its Python). They take the recipe as a string
# (`encode_recipe`), the backend by name and the layer's `LayerState` by id. SR generators
# advance inside the ops, at run time, in the same order eager runs them, so a compiled model
# draws the same bits as an eager one and the generator states stay what `state_dict` saves.


def _fprop_weight(
    state: LayerState,
    weight: torch.Tensor,
    recipe_key: str,
    recipe: LayerRecipe,
    backend: Backend,
    k_f: int,
    training: bool,
    wants_dgrad: bool = False,
):
    """(W operand of Fprop, its packed form when Dgrad reuses it, Dgrad's Wᵀ operand when the same cast made
    it), cached per weight epoch. `wants_dgrad`: this forward saves W for a Dgrad."""
    spec = recipe.fprop_w

    def build():
        if recipe.reuses_fprop_weight:
            # Quantize W once into its storage form: Fprop uses it, Dgrad reuses the same bits.
            if training and wants_dgrad and state.weights.enabled:
                # 128x128 FP8 tiles: Dgrad's Wᵀ (the same tiles transposed, its K padded) written by the same
                # pass, into this cache entry, instead of a transposing copy of Fprop's codes in Dgrad.
                k_d = _dgrad_k(weight.shape[0], recipe, backend.name)
                both = state.pack_with_transpose("fprop_w", weight, spec, k_f, k_d)
                if both is not None:
                    return both[0].dequantize(), both[0], both[1]
            packed = state.pack("fprop_w", weight, spec, k_f)
            return packed.dequantize(), packed, None
        if training and state.weights.enabled and pairs.tensorwise_pair(spec, recipe.dgrad_w):
            # Per-tensor FP8: Dgrad's Wᵀ is W's codes transposed. One cast writes both; Dgrad finds its
            # operand in this cache entry (without the cache it quantizes Wᵀ itself).
            out_f = weight.shape[0]
            both = state.quantize_with_transpose("fprop_w", weight, spec, k_f, _dgrad_k(out_f, recipe, backend.name))
            if both is not None:
                return both[0], None, both[1]
        if training and wants_dgrad and state.weights.enabled and pairs.four_over_six_weight_pair(spec, recipe.dgrad_w):
            # 4over6, 16x16 tiles: Dgrad's Wᵀ chooses its candidates itself (not W's bits transposed), from the same
            # tile maxima, candidates and element errors: one pass writes both, Dgrad finds its in this cache entry.
            k_d = _dgrad_k(weight.shape[0], recipe, backend.name)
            both = state.quantize_weight_pair("fprop_w", weight, spec, k_f, k_d)
            if both is not None:
                return both[0], None, both[1]
        return state.quantize("fprop_w", weight, spec, k_f), None, None

    if spec.rounding == "sr":
        return build()
    return state.weights.get(("fprop", recipe_key, backend.name, k_f), weight, build, training)


def _transposed_weight(w_q: operands.Quantized, in_f: int, k_d: int) -> operands.Quantized:
    """Fprop's padded [out_p, in_p] W operand as Dgrad's [in, K = out] operand (K zero-padded to k_d):
    the same bits."""
    if w_q.fp8_scales is not None:  # blockwise FP8, 128x128 tiles: the tiles transposed
        data, scales = pad_fp8_k(w_q.fp8_data.t(), w_q.fp8_scales.t(), k_d)
        return operands.Quantized(None, None, data.contiguous(), scales.contiguous(), w_q.spec, rows=in_f)
    wt_values = w_q.values.t()[:in_f]
    k_d = max(k_d, wt_values.shape[1])
    return operands.Quantized(operands.pad2d(wt_values, in_f, k_d), w_q.decode_scale)


@functools.lru_cache(maxsize=4096)
def _fprop_out_width(out_f: int, recipe: LayerRecipe, backend_name: str) -> int:
    """The row length of the buffer Fprop's GEMM writes Y [tokens, out_f] into (`backends.gemm_out_width`)."""
    return gemm_out_width(backend_name, recipe.fprop_x, recipe.fprop_w, out_f)


def _with_row_stride(y2d: torch.Tensor, width: int) -> torch.Tensor:
    """y2d [m, n] as the first n columns of an [m, width] row-major buffer, the layout the fake promises: as it
    is where the GEMM wrote it so (no copy), else copied into one (a GEMM that did not pad as predicted)."""
    if y2d.stride() == (width, 1):
        return y2d
    out = y2d.new_empty((y2d.shape[0], width))[:, : y2d.shape[1]]
    return out.copy_(y2d)


def _saves_x_copy(recipe: LayerRecipe, x_dtype: torch.dtype, x_prologue: str = "") -> bool:
    """Whether Fprop returns a copy of X for Wgrad: a quantized one, Fprop's quantized X dequantized
    (backward_override=dequantized), or a BF16 copy of a non-BF16 X or of a prologue's output (a BF16 X is
    saved as it is)."""
    wgrad_x = recipe.wgrad_x
    return not wgrad_x.is_bf16 or wgrad_x.scale_mode == DEQUANTIZED or x_dtype != torch.bfloat16 or bool(x_prologue)


def _dequantized(q: operands.Quantized, rows: int, cols: int) -> torch.Tensor:
    """The [rows, cols] values a quantized operand stands for, in BF16 (TE's dequantize into the activations'
    dtype): its values times its decode scale (0-d, or one per row when row-scaled)."""
    scale = q.decode_scale if q.decode_scale.dim() == 0 else q.decode_scale[:rows]
    return (q.values[:rows, :cols].float() * scale).to(torch.bfloat16)


def _wgrad_x_shape(recipe: LayerRecipe, in_f: int, tokens) -> tuple:
    """The prepared shape of the Wgrad X operand Xᵀ [in, tokens] (rows tile-padded, K = tokens padded)."""
    if recipe.wgrad_x.is_bf16:
        return (tokens, in_f)  # the BF16 copy is kept untransposed and unpadded
    return (round_up(in_f, recipe.wgrad_x.row_block), _k_pad(tokens, recipe.wgrad_dy, recipe.wgrad_x))


def _autocast_off(device_type: str):
    """Autocast off for the op's body (its GEMMs and quantizers choose their dtypes), entered only where it is on:
    backward runs without it, and entering the context costs host time at every call."""
    return torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) else _NO_CONTEXT


_NO_CONTEXT = contextlib.nullcontext()


@torch.library.custom_op("nvfp4train::quant_linear_fprop", mutates_args=())
def quant_linear_fprop(
    x: torch.Tensor,
    weight: torch.Tensor,
    layer_id: int,
    recipe_key: str,
    backend_name: str,
    out_dtype: torch.dtype,
    save_x: bool,
    save_w: bool,
    strided_out: bool,
    x_prologue: str,
) -> list[torch.Tensor]:
    """[Y = Q(X) Q(W)ᵀ, *the Wgrad copy of X (packed) if save_x, *the packed W if save_w and Dgrad
    reuses it]. Y is in `out_dtype`; every tensor is new and contiguous, except Y with `strided_out`: the first
    out_features columns of a [tokens, width] buffer, width the GEMM's padded N (`_fprop_out_width`), so a GEMM
    that pads N is not followed by a copy that crops it (for a caller that reads Y through views anyway).
    `x_prologue` (a formats.activation name, or ""): the layer's input is activation.apply(x_prologue, x),
    applied by the quantizers as they read x where they can (`pairs.takes_prologue`), written out otherwise."""
    state, recipe, backend = _state(layer_id), decode_recipe(recipe_key), get_backend(backend_name)
    out_f, in_f = weight.shape
    with _autocast_off(x.device.type):
        x2d = x.reshape(-1, in_f)
        k_f = _fprop_k(in_f, recipe, backend_name)
        w_q, w_packed, _ = _fprop_weight(state, weight, recipe_key, recipe, backend, k_f, save_x or save_w, save_w)
        saves_xt = save_x and _saves_x_copy(recipe, x.dtype, x_prologue) and not recipe.wgrad_x.is_bf16
        k_w = _k_pad(x2d.shape[0], recipe.wgrad_dy, recipe.wgrad_x)
        # Fprop's X and the Wgrad Xᵀ from one read of X where the recipe allows (telemetry wants each alone)
        both = (
            pairs.fprop_and_wgrad_x(x2d, recipe.fprop_x, recipe.wgrad_x, k_f, k_w, state.rht_signs, x_prologue or None)
            if saves_xt and state.stats is None
            else None
        )
        if x_prologue and not both:
            x2d = activation.apply(x_prologue, x2d)
        x_q = both[0] if both else state.quantize("fprop_x", x2d, recipe.fprop_x, k_f)
        y2d = backend.gemm(x_q, w_q.first_rows(out_f), out_dtype)
        if strided_out:
            y2d = _with_row_stride(y2d, _fprop_out_width(out_f, recipe, backend_name))
        y = y2d.reshape(*x.shape[:-1], out_f)
        outputs = [y]
        if save_x and _saves_x_copy(recipe, x.dtype, x_prologue):
            if recipe.wgrad_x.scale_mode == DEQUANTIZED:
                outputs.append(_dequantized(x_q, x2d.shape[0], in_f))
            elif recipe.wgrad_x.is_bf16:
                outputs.append(x2d.to(torch.bfloat16))
            elif both:
                outputs.extend(both[1].tensors)
            else:  # Xᵀ [in, tokens], quantized along tokens now, saved packed
                outputs.extend(state.pack("wgrad_x", x2d.t(), recipe.wgrad_x, k_w).tensors)
        if save_w and w_packed is not None:
            outputs.extend(t.clone() for t in w_packed.tensors)  # the cache keeps its own
    return [outputs[0] if strided_out else outputs[0].contiguous()] + [t.contiguous() for t in outputs[1:]]


@quant_linear_fprop.register_fake
def _(x, weight, layer_id, recipe_key, backend_name, out_dtype, save_x, save_w, strided_out, x_prologue):
    recipe = decode_recipe(recipe_key)
    out_f, in_f = weight.shape
    width = _fprop_out_width(out_f, recipe, backend_name) if strided_out else out_f
    if width != out_f:  # the layout the op returns Y in: see _with_row_stride
        y = x.new_empty((x.numel() // in_f, width), dtype=out_dtype)[:, :out_f].reshape(*x.shape[:-1], out_f)
    else:
        y = x.new_empty((*x.shape[:-1], out_f), dtype=out_dtype)
    outputs = [y]
    storage = []
    if save_x and _saves_x_copy(recipe, x.dtype, x_prologue):
        tokens = x.numel() // in_f
        storage += operands.packed_shapes(recipe.wgrad_x, _wgrad_x_shape(recipe, in_f, tokens))
    if save_w and recipe.reuses_fprop_weight:
        k_f = _fprop_k(in_f, recipe, backend_name)
        storage += operands.packed_shapes(recipe.fprop_w, (round_up(out_f, recipe.fprop_w.row_block), k_f))
    return outputs + [x.new_empty(shape, dtype=dtype) for shape, dtype in storage]


@torch.library.custom_op("nvfp4train::quant_linear_dgrad", mutates_args=())
def quant_linear_dgrad(
    dy: torch.Tensor,
    weight: torch.Tensor,
    w_saved: list[torch.Tensor],
    layer_id: int,
    recipe_key: str,
    backend_name: str,
    x_dtype: torch.dtype,
    dy_q: list[torch.Tensor],
) -> torch.Tensor:
    """dX = Q(dY) Q(W), K = out_features, in dY's dtype then `x_dtype`. `w_saved`: the packed
    Fprop W when Dgrad reuses it (used when the weight cache does not hold it). `dy_q`: Q(dY) already
    made by quant_linear_dy (two tensors, `pairs.operand_tensors`), or empty: quantized here."""
    state, recipe, backend = _state(layer_id), decode_recipe(recipe_key), get_backend(backend_name)
    out_f, in_f = weight.shape
    with _autocast_off(dy.device.type):
        dy2d = dy.reshape(-1, out_f)
        k_d, k_f = _dgrad_k(out_f, recipe, backend_name), _fprop_k(in_f, recipe, backend_name)
        if recipe.reuses_fprop_weight:

            def build():
                cached = state.weights.peek(("fprop", recipe_key, backend.name, k_f), weight)
                if cached is not None and cached[2] is not None:  # Wᵀ written with W (128x128 FP8 tiles)
                    return cached[2]
                if cached is not None:
                    w_q = cached[0]
                else:  # Fprop's bits, from what it saved
                    layout = operands.PackedLayout(recipe.fprop_w, (round_up(out_f, recipe.fprop_w.row_block), k_f))
                    w_q = layout.rebuild(w_saved).dequantize()
                return _transposed_weight(w_q, in_f, k_d)
        else:

            def build():
                cached = state.weights.peek(("fprop", recipe_key, backend.name, k_f), weight)
                if cached is not None and cached[2] is not None:  # Wᵀ made with W (per-tensor FP8; 4over6 16x16)
                    return cached[2]
                wt = weight.t()
                if recipe.dgrad_w.scale_mode == DEQUANTIZED:  # Fprop's W operand (RNE: the same bits again)
                    w_q = cached[0] if cached is not None else state.quantize("fprop_w", weight, recipe.fprop_w, k_f)
                    wt = _dequantized(w_q, out_f, in_f).t()
                return state.quantize("dgrad_w", wt, recipe.dgrad_w, k_d).first_rows(in_f)

        if recipe.dgrad_w.rounding == "sr":
            wt_q = build()
        else:
            wt_q = state.weights.get(("dgrad", recipe_key, backend.name, k_d), weight, build)
        dy_op = (
            pairs.ready_operand(dy_q, recipe.dgrad_dy)
            if dy_q
            else state.quantize("dgrad_dy", dy2d, recipe.dgrad_dy, k_d)
        )
        dx = backend.gemm(dy_op, wt_q, dy.dtype).to(x_dtype)
    return dx.reshape(*dy.shape[:-1], in_f).contiguous()


@quant_linear_dgrad.register_fake
def _(dy, weight, w_saved, layer_id, recipe_key, backend_name, x_dtype, dy_q):
    return dy.new_empty((*dy.shape[:-1], weight.shape[1]), dtype=x_dtype)


@torch.library.custom_op("nvfp4train::quant_linear_wgrad", mutates_args=())
def quant_linear_wgrad(
    dy: torch.Tensor,
    x_saved: list[torch.Tensor],
    layer_id: int,
    recipe_key: str,
    backend_name: str,
    in_features: int,
    out_dtype: torch.dtype,
    dy_q: list[torch.Tensor],
) -> torch.Tensor:
    """dW = Q(RHT(dYᵀ)) Q(RHT(Xᵀ))ᵀ, K = tokens, in `out_dtype` (the weight's). `x_saved`: what
    Fprop saved of X (packed Xᵀ, or X in BF16). `dy_q`: Q(RHT(dYᵀ)) already made by quant_linear_dy
    (two tensors, `pairs.operand_tensors`), or empty: quantized here."""
    state, recipe, backend = _state(layer_id), decode_recipe(recipe_key), get_backend(backend_name)
    out_f = dy.shape[-1]
    with _autocast_off(dy.device.type):
        dy2d = dy.reshape(-1, out_f)
        tokens = dy2d.shape[0]
        k_w = _k_pad(tokens, recipe.wgrad_dy, recipe.wgrad_x)
        dyt_q = (
            pairs.ready_operand(dy_q, recipe.wgrad_dy)
            if dy_q
            else state.quantize("wgrad_dy", dy2d.t(), recipe.wgrad_dy, k_w)
        )
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
def quant_linear_dy(
    dy: torch.Tensor,
    layer_id: int,
    recipe_key: str,
    backend_name: str,
    prologue: str = "",
    act_input: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Both gradient operands of a layer whose recipe has `pairs.dy_pair`, two tensors each
    (`pairs.operand_tensors`: NVFP4 dense values + decode scale, FP8 data + block scales), from one
    read of dY where `pairs.dgrad_and_wgrad_dy` can (the bits of the two separate quantizations);
    quantized one after the other otherwise, and on steps that record telemetry. `prologue` (a
    formats.activation name, or ""): the layer's output gradient is activation.apply(prologue, dy, act_input),
    applied by the quantizers as they read dy where they can, written out otherwise."""
    state, recipe = _state(layer_id), decode_recipe(recipe_key)
    out_f = dy.shape[-1]
    with _autocast_off(dy.device.type):
        dy2d = dy.reshape(-1, out_f)
        a2d = None if act_input is None else act_input.reshape(-1, out_f)
        k_d = _dgrad_k(out_f, recipe, backend_name)
        k_w = _k_pad(dy2d.shape[0], recipe.wgrad_dy, recipe.wgrad_x)
        both = None
        if state.stats is None:
            both = pairs.dgrad_and_wgrad_dy(
                dy2d,
                recipe.dgrad_dy,
                recipe.wgrad_dy,
                k_d,
                k_w,
                state.rht_signs,
                state.sr_generator("dgrad_dy", recipe.dgrad_dy, dy.device),
                state.sr_generator("wgrad_dy", recipe.wgrad_dy, dy.device),
                prologue or None,
                a2d,
            )
        if both is None:
            dy2d = activation.apply(prologue or None, dy2d, a2d)
            both = (
                state.quantize("dgrad_dy", dy2d, recipe.dgrad_dy, k_d),
                state.quantize("wgrad_dy", dy2d.t(), recipe.wgrad_dy, k_w),
            )
    return [
        t.contiguous()
        for q, spec in zip(both, (recipe.dgrad_dy, recipe.wgrad_dy))
        for t in pairs.operand_tensors(q, spec)
    ]


@quant_linear_dy.register_fake
def _(dy, layer_id, recipe_key, backend_name, prologue="", act_input=None):
    recipe = decode_recipe(recipe_key)
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


def packed_weight_count(recipe: LayerRecipe, save_w: bool) -> int:
    """How many of `quant_linear_fprop`'s outputs are the packed W it returns for Dgrad (the last ones)."""
    return len(operands.packed_shapes(recipe.fprop_w, (1, 1))) if save_w and recipe.reuses_fprop_weight else 0


def fprop_saved(x: torch.Tensor, output, save_x: bool, n_w: int) -> tuple[list, list]:
    """What `quant_linear_fprop`'s output keeps for backward (`n_w`: `packed_weight_count`): (Wgrad's copy of X,
    or X itself where the op saved none; Dgrad's packed W), the lists `quant_linear_wgrad` and
    `quant_linear_dgrad` take."""
    n_x = len(output) - 1 - n_w
    x_saved = list(output[1 : 1 + n_x]) if n_x else ([x] if save_x else [])
    return x_saved, list(output[1 + n_x :])


def _setup_context(ctx, inputs, output):
    x, weight, layer_id, recipe_key, backend_name, out_dtype, save_x, save_w, _, x_prologue = inputs
    x_saved, w_saved = fprop_saved(x, output, save_x, packed_weight_count(decode_recipe(recipe_key), save_w))
    ctx.mark_non_differentiable(*output[1:])
    # With a prologue, dX is the gradient of its output: backward turns it into x's, from x.
    ctx.x_prologue = x_prologue if save_w else ""
    ctx.save_for_backward(weight, *x_saved, *w_saved, *([x] if ctx.x_prologue else []))
    ctx.n_x = len(x_saved)
    ctx.args = (layer_id, recipe_key, backend_name)
    ctx.x_dtype = x.dtype


def _backward(ctx, grads):
    dy = grads[0]
    weight, *saved = ctx.saved_tensors
    if ctx.x_prologue:
        *saved, x = saved
    layer_id, recipe_key, backend_name = ctx.args
    dx = dw = None
    recipe = decode_recipe(recipe_key)
    # Both gradient operands from one read of dY when both GEMMs run (a lone Dgrad or Wgrad quantizes
    # only its own, so the other role's SR stream does not advance)
    dy_q = (
        quant_linear_dy(dy, layer_id, recipe_key, backend_name)
        if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and pairs.dy_pair(recipe.dgrad_dy, recipe.wgrad_dy)
        else []
    )
    if ctx.needs_input_grad[0]:
        dx = quant_linear_dgrad(dy, weight, saved[ctx.n_x :], layer_id, recipe_key, backend_name, ctx.x_dtype, dy_q[:2])
        if ctx.x_prologue:
            dx = activation.apply(activation.GRADIENTS[ctx.x_prologue], dx, x)
    if ctx.needs_input_grad[1]:
        dw = quant_linear_wgrad(
            dy, saved[: ctx.n_x], layer_id, recipe_key, backend_name, weight.shape[1], weight.dtype, dy_q[2:]
        )
    return dx, dw, None, None, None, None, None, None, None, None


quant_linear_fprop.register_autograd(_backward, setup_context=_setup_context)
