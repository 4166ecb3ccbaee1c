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

The layer's random constants are buffers (`sr_seeds`: one stream seed per operand role; `rht_signs`: the
Hadamard sign vector), so they travel in its state_dict and checkpoints; where each SR stream stands (per rank)
is checkpointed by the controller. The three GEMMs run as custom ops (`ops.py`), which reach the layer's
`ops.LayerState` (host copies of those constants, the SR generators, telemetry, weight cache) by an int id.
Quantized weight operands are cached per layer within a weight epoch (`WeightCache`, `WeightEpoch`: one counter
the layers of a model share, bumped by the optimizer's post-step hook, loads, CUDA graph captures and precision
switches): one quantization per optimizer step, not one per micro-batch and per GEMM; an evaluation's forwards
share one of their own (`WeightCache.eval_epoch`): one quantization per evaluation, not one per batch.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F

from . import ops
from .backends import Backend, get_backend
from .layer import PrecisionLinear
from .recipe import ROLES, LayerRecipe

log = logging.getLogger(__name__)


class SRStreams:
    """A layer's stochastic-rounding generators, one per operand role, so toggling SR on one
    operand never shifts the random draws of another. Each is seeded from its role's entry of `seeds`
    (the layer's `sr_seeds` buffer, read once to the host), created on first use on the data's device;
    their states (the position in each stream, per rank) are checkpointed by the controller."""

    def __init__(self, seeds: list[int], label: str):
        self.seeds, self.label = list(seeds), label
        self._generators: dict[str, torch.Generator] = {}
        self._pending_states: dict[str, torch.Tensor] = {}

    def reseed(self, seeds: list[int]) -> None:
        """New stream seeds (a loaded state dict's): generators made from the old ones are dropped; saved
        positions waiting to be applied (`load_state`) stay."""
        if list(seeds) != self.seeds:
            self.seeds, self._generators = list(seeds), {}

    def generator(self, role: str, device: torch.device) -> torch.Generator:
        """The SR generator of operand `role` on `device`."""
        gen = self._generators.get(role)
        if gen is None or gen.device.type != device.type:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seeds[ROLES.index(role)])
            pending = self._pending_states.pop(role, None)
            if pending is not None:
                try:
                    gen.set_state(pending)
                except (RuntimeError, ValueError):
                    # A CPU generator state does not fit a CUDA generator (or vice versa).
                    log.warning(
                        "%s/%s: saved SR generator state does not fit a %s generator; "
                        "continuing from the seeded stream",
                        self.label,
                        role,
                        device.type,
                    )
            self._generators[role] = gen
        return gen

    def state(self) -> dict[str, torch.Tensor]:
        states = dict(self._pending_states)
        states.update({role: gen.get_state() for role, gen in self._generators.items()})
        return states

    def load_state(self, states: dict[str, torch.Tensor] | None) -> None:
        self._generators = {}  # re-created on the next SR draw, on the data's device
        self._pending_states = dict(states or {})

    def positions(self) -> tuple:
        """Where every stream stands now, for `rewind`."""
        states = {role: gen.get_state() for role, gen in self._generators.items()}
        return dict(self._generators), dict(self._pending_states), states

    def rewind(self, positions: tuple) -> None:
        """Back to `positions`, undoing the draws made since (an evaluation's): the same generator objects,
        which a CUDA graph may have registered, set to their saved states; one created since is dropped."""
        generators, pending, states = positions
        for role, gen in generators.items():
            gen.set_state(states[role])
        self._generators, self._pending_states = generators, pending


class WeightEpoch:
    """How many times the weights of the quantized linears sharing it may have changed, and those linears'
    quantized weight operands of the current epoch (`WeightCache` entries). `bump()` starts a new epoch: the
    operands of the old one are freed at once and each layer's next training use quantizes its weight again.

    One epoch is shared by every linear one layer factory (`PrecisionLayers`) builds, and by every linear of a
    `PrecisionController` (it adopts one epoch for them all). Bumped by the optimizer's post-step hook
    (`controller.weights_changed_after_each_step`, which the training engine installs), the controller's
    `on_step` / `weights_changed` / `load_state_dict`, a layer's `load_state_dict`, a precision switch, a CUDA
    graph capture (before and after) and `precision.weights_changed(model)`, the one call for a user who
    changes weights by hand (`copy_`, `.data`): the cache does not look at the weight's storage or version
    counter, which torch's fused AdamW, DeepSpeed (through `.data`) and FSDP2 (a fresh gather at every use)
    do not keep meaningful."""

    def __init__(self):
        self.value = 0
        self._entries: dict[int, tuple[tuple, dict[tuple, Any]]] = {}  # cache id -> (weight's form, entries)

    def bump(self) -> None:
        self.value += 1
        self._entries.clear()

    def discard(self, cache_id: int) -> None:
        """Free one cache's entries (a layer leaving this epoch for another)."""
        self._entries.pop(cache_id, None)

    def __repr__(self) -> str:
        return f"WeightEpoch({self.value}, {len(self._entries)} layer(s) cached)"


_CACHE_IDS = itertools.count()


class WeightCache:
    """A layer's quantized weight operands, kept from one use to the next within a weight epoch
    (`WeightEpoch`, shared with the layer's siblings): built by the first training forward of the epoch,
    reused by the other micro-batches' forwards and by every Dgrad, instead of quantizing the FP32 master
    weight again. The entries live in the epoch, keyed on this cache, so a bump frees them all. Beside the
    epoch, an entry is kept only for a weight of the same shape, dtype and device (`model.to(...)`).
    Stochastically rounded weight operands are never cached (each use draws anew, as before).

    An evaluation's forwards (no_grad) read `eval_epoch` instead, set only for the length of one evaluation
    (`controller.weights_quantized_once`): a `WeightEpoch` of their own, which training never reads, made
    afresh by each evaluation and emptied at its end. A cache turned off (`cache_weights=False`) keeps
    neither."""

    def __init__(self, epoch: WeightEpoch | None = None):
        self.enabled = False  # set by PrecisionController: it installs the epoch's bumps
        self.epoch = epoch if epoch is not None else WeightEpoch()
        self.eval_epoch: WeightEpoch | None = None
        self.id = next(_CACHE_IDS)

    @staticmethod
    def _form(weight: torch.Tensor) -> tuple:
        return (tuple(weight.shape), weight.dtype, weight.device)

    def get(self, key: tuple, weight: torch.Tensor, build, training: bool = True):
        """`build()`, or its result from an earlier call with the same `key` in this epoch. Training passes
        (`training`: a forward that saves for backward, or a backward) use the training epoch; a forward that
        does not (no_grad) uses `eval_epoch` inside an evaluation and quantizes afresh elsewhere, so it needs
        no bump after changed weights, and an evaluation's operands (built without Dgrad's Wᵀ) never reach a
        training pass."""
        epoch = self.epoch if training else self.eval_epoch
        if not self.enabled or epoch is None:
            return build()
        form = self._form(weight)
        held = epoch._entries.get(self.id)
        if held is None or held[0] != form:
            held = epoch._entries[self.id] = (form, {})
        entries = held[1]
        if key not in entries:
            entries[key] = build()
        return entries[key]

    def peek(self, key: tuple, weight: torch.Tensor):
        """The entry `get` would return for `key` and this weight, or None (nothing is built)."""
        held = self.epoch._entries.get(self.id) if self.enabled else None
        if held is None or held[0] != self._form(weight):
            return None
        return held[1].get(key)


class _BF16LinearFP32Wgrad(torch.autograd.Function):
    """F.linear(x, weight) in x's dtype (BF16 under autocast) whose weight gradient leaves the Wgrad GEMM in
    FP32, its accumulator's precision, for the FP32 weight's gradient; `F.linear` under autocast rounds it to
    BF16 and casts it back (a kernel that reads 2 and writes 4 bytes a weight, and a BF16 rounding of every
    weight gradient). Megatron-LM with Transformer Engine accumulates BF16 layers' weight gradients in FP32
    (its gradient-accumulation fusion); the quantized GEMMs here return FP32 weight gradients too. Forward
    and the input gradient are F.linear's, bit for bit. CUDA only (`torch.mm(..., out_dtype=)`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        w = weight.to(x.dtype)
        ctx.save_for_backward(x, w)
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = dy @ w if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = torch.mm(dy.reshape(-1, dy.shape[-1]).t(), x.reshape(-1, x.shape[-1]), out_dtype=torch.float32)
        return dx, dw


def bf16_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A BF16 layer's GEMMs: with an FP32 weight under CUDA autocast, `_BF16LinearFP32Wgrad` (FP32 weight
    gradients); elsewhere F.linear (bit-identical to nn.Linear, autocast included)."""
    device = x.device.type
    if device == "cuda" and weight.dtype == torch.float32 and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        if dtype != torch.float32:
            return _BF16LinearFP32Wgrad.apply(x.to(dtype), weight)
    return F.linear(x, weight)


class QuantLinear(PrecisionLinear):
    """y = x @ weight.T with the GEMM numerics `policy` gives block `block_index`.

    `.weight` is an FP32 [out, in] parameter (the master copy the optimizer owns); every GEMM
    quantizes from it. A layer whose recipe is all-BF16 runs `bf16_linear`: F.linear's forward and input
    gradient, and on CUDA an FP32 weight gradient. The layer keeps its two `LayerRecipe`s (before and after
    the schedule's switch to BF16), not the policy."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        backend: Backend | str = "emulated",
        weight_epoch: WeightEpoch | None = None,
        **common,
    ):
        """`weight_epoch`: the epoch its weight cache is keyed on, shared with the other linears of the model
        (the factory's); None: one of its own (a `PrecisionController` makes its linears share one)."""
        super().__init__(in_features, out_features, **common)
        policy, block_index = common["policy"], self.block_index
        self.format = policy.format
        self.backend = get_backend(backend)
        # The ops read host copies of the layer's seed and sign buffers (no device read per GEMM, none inside a
        # CUDA graph capture), refreshed when a state dict is loaded (`constants_loaded`).
        self.sr = SRStreams(self.sr_seed_values, self.label)
        self.weight_cache = WeightCache(weight_epoch)
        self._state = ops.LayerState(self.sr, self.rht_sign_values, self.weight_cache)
        self.layer_id = self._state.id  # what the custom ops get
        self._stats: dict[str, list[float]] = defaultdict(list)
        self.recipes = {
            switched: policy.layer_recipe(block_index, self.n_blocks, switched=switched) for switched in (False, True)
        }
        self.recipe = self.recipes[False]

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def constants_loaded(self) -> None:
        super().constants_loaded()
        self.sr.reseed(self.sr_seed_values)
        self._state.rht_signs = self.rht_sign_values

    def _load_from_state_dict(self, *args, **kwargs):
        """As PrecisionLinear's; a loaded weight starts a new weight epoch (`WeightEpoch`)."""
        super()._load_from_state_dict(*args, **kwargs)
        self.weight_cache.epoch.bump()

    @property
    def recipe(self) -> LayerRecipe:
        return self._recipe

    @recipe.setter
    def recipe(self, recipe: LayerRecipe) -> None:
        # The forward reads plain attributes (a bool, a string): cheap for dynamo to guard on.
        changed = getattr(self, "_recipe", recipe) != recipe
        self._recipe, self.recipe_key, self.quantized = recipe, ops.encode_recipe(recipe), not recipe.all_bf16
        if changed:  # a precision switch: the old recipe's operands are not wanted again
            self.weight_cache.epoch.bump()

    @property
    def stats_enabled(self) -> bool:
        return self._state.stats is not None

    @stats_enabled.setter
    def stats_enabled(self, enabled: bool) -> None:
        self._state.stats = self._stats if enabled else None

    @property
    def cache_weights(self) -> bool:
        """Whether quantized weight operands are kept between uses (see `WeightCache`)."""
        return self.weight_cache.enabled

    @cache_weights.setter
    def cache_weights(self, enabled: bool) -> None:
        self.weight_cache.enabled = bool(enabled)
        self.weight_cache.epoch.bump()

    @property
    def weight_epoch(self) -> WeightEpoch:
        """The epoch its cached weight operands belong to (`WeightEpoch`)."""
        return self.weight_cache.epoch

    @weight_epoch.setter
    def weight_epoch(self, epoch: WeightEpoch) -> None:
        self.weight_cache.epoch.discard(self.weight_cache.id)  # what it cached there is freed
        self.weight_cache.epoch = epoch

    def extra_repr(self) -> str:
        kind = "bf16" if self.recipe.all_bf16 else self.format
        return (
            f"{self.in_features}, {self.out_features}, {self.label}, {kind}, backend={self.backend.name}, "
            f"switched={self.switched}"
        )

    # ------------------------------------------------------------------ schedule
    def set_switched(self, switched: bool) -> None:
        self.switched = bool(switched)
        self.recipe = self.recipes[self.switched]

    # ------------------------------------------------------------------ stochastic rounding streams
    def sr_generators(self, device: torch.device) -> list[torch.Generator]:
        """The SR generators the current recipe draws from on `device` (created now where not yet): what a
        CUDA graph capture registers."""
        if not self.quantized:
            return []
        return [self.sr.generator(role, device) for role in ROLES if getattr(self.recipe, role).rounding == "sr"]

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
            return bf16_linear(x, self.weight)
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
        outputs = ops.quant_linear_fprop(
            x,
            self.weight,
            self.layer_id,
            self.recipe_key,
            self.backend.name,
            x.dtype,
            save_x,
            save_w,
            self.strided_output,
            "",
        )
        return outputs[0]
