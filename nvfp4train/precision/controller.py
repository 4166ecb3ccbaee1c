"""The layer factory the model asks, and the controller the trainer drives.

factory = build_linear_factory(policy, n_blocks, seed)   # a model.layers.LayerFactory
layer = factory.linear(in_features, out_features, block_index=3, name="fc1")   # QuantLinear / TELinear
mlp = factory.mlp(d_model, ffn_hidden, block_index=3)   # precision.mlp.SquaredReLUMLP, or None
ctl = PrecisionController(policy, model)
msg = ctl.on_step(tokens_fraction)   # schedule switch + telemetry gating, once per step
ctl.weights_changed()                # weights changed outside optimizer.step(): a new weight epoch
weights_changed(model)               # the same for any model of precision linears, controller or not
with weights_quantized_once(layers): ...   # an evaluation: each weight quantized once for all its batches
stats = ctl.quant_stats()            # {"quant/block3.fc1/wgrad_dy/rel_err": ..., ...}
torch.save(ctl.state_dict(), f)      # switch state + SR generator states (weights_only-loadable)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from nvfp4train.model.layers import LINEAR_NAMES

from .backends import TE, TELinear, resolve_backend
from .layer import PrecisionLinear
from .linear import QuantLinear, WeightEpoch
from .mlp import SquaredReLUMLP, recipes_fuse
from .recipe import FORWARD_ROLES, PrecisionPolicy

log = logging.getLogger(__name__)


class PrecisionLayers:
    """The model's layer factory (`model.layers.LayerFactory`) for one policy: `linear` builds a QuantLinear (a
    TELinear on the te backend) running `policy.for_module(its name)`, `mlp` the FP8 MLP as one node where the
    block's fc1 and fc2 recipes fuse. `backend_name` / `backend_reason`: the backend resolved once;
    `weight_epoch`: the `WeightEpoch` its QuantLinears share (their weight caches' key)."""

    def __init__(self, policy: PrecisionPolicy, n_blocks: int, seed: int, modules: Mapping[str, tuple[int, str]]):
        self.policy, self.n_blocks, self.seed = policy, n_blocks, seed
        self.module_of = {where: module for module, where in modules.items()}
        self.backend, self.backend_reason = resolve_backend(policy)
        self.backend_name = self.backend.name
        self.weight_epoch = WeightEpoch()  # shared by the QuantLinears it builds (their weight caches' key)

    def linear(
        self, in_features: int, out_features: int, *, block_index: int, name: str, strided_output: bool = False
    ) -> nn.Module:
        if name not in LINEAR_NAMES:
            raise ValueError(f"layer factory: name={name!r} is not one of {list(LINEAR_NAMES)}")
        policy = self.policy
        module = self.module_of.get((block_index, name))
        pattern = policy.module_pattern(module)
        layer_policy = policy.for_module(module)
        kwargs = dict(
            policy=layer_policy,
            block_index=block_index,
            n_blocks=self.n_blocks,
            name=name,
            seed=self.seed,
            strided_output=strided_output,
        )
        if self.backend is TE:
            layer = TELinear(in_features, out_features, **kwargs)
        else:
            layer = QuantLinear(
                in_features, out_features, backend=self.backend, weight_epoch=self.weight_epoch, **kwargs
            )
        layer.backend_reason = self.backend_reason
        layer.module_name = module
        layer.precision_source = (
            f"precision.modules.{pattern}: {layer_policy.name or layer_policy.format}" if pattern is not None else ""
        )
        return layer

    def mlp(self, in_features: int, hidden_features: int, *, block_index: int) -> nn.Module | None:
        """A `SquaredReLUMLP` where fc1's and fc2's recipes fuse before or after the switch, else None (the
        model's MLP: the same function and bits, the layers one by one). Decided from the policy, before any layer
        is built (a layer's init draws from torch's generator)."""
        if self.backend is TE:
            return None
        fc1_policy, fc2_policy = self._policy_of(block_index, "fc1"), self._policy_of(block_index, "fc2")
        if not any(
            recipes_fuse(
                fc1_policy.layer_recipe(block_index, self.n_blocks, switched=switched),
                fc2_policy.layer_recipe(block_index, self.n_blocks, switched=switched),
            )
            for switched in (False, True)
        ):
            return None
        fc1 = self.linear(in_features, hidden_features, block_index=block_index, name="fc1")
        fc2 = self.linear(hidden_features, in_features, block_index=block_index, name="fc2")
        return SquaredReLUMLP(fc1, fc2)

    def _policy_of(self, block_index: int, name: str) -> PrecisionPolicy:
        return self.policy.for_module(self.module_of.get((block_index, name)))

    def __repr__(self) -> str:
        return f"PrecisionLayers({self.policy.name or self.policy.format}, backend={self.backend_name})"


def build_linear_factory(
    policy: PrecisionPolicy, n_blocks: int, seed: int, modules: Mapping[str, tuple[int, str]] | None = None
) -> PrecisionLayers:
    """The model's layer factory (`model.layers.LayerFactory`): `linear(in_features, out_features, *, block_index,
    name, strided_output=False) -> nn.Module` and `mlp(in_features, hidden_features, *, block_index)`.

    Resolves the backend once (auto logs its choice). `seed` seeds the per-layer SR streams. `modules`: the
    model's linears, {module name: (block_index, name)} (`ModelConfig.linear_modules()`), which
    precision.modules' patterns match; needed where the policy has any. Each linear runs
    `policy.for_module(its name)`, and says which in `precision_source`."""
    if not isinstance(policy, PrecisionPolicy):
        raise TypeError(f"build_linear_factory: policy must be a PrecisionPolicy, got {type(policy).__name__}")
    if n_blocks < 1:
        raise ValueError(f"build_linear_factory: n_blocks must be >= 1, got {n_blocks}")
    if policy.modules and modules is None:
        raise ValueError("build_linear_factory: precision.modules needs the model's linears (modules=)")
    if modules is not None:
        policy.check_module_names(modules)
    factory = PrecisionLayers(policy, n_blocks, seed, modules or {})
    name = policy.name or policy.format
    log.info("precision %s: backend %s (%s)", name, factory.backend_name, factory.backend_reason)
    log.info("precision %s", policy.summary(n_blocks))
    for line in module_lines(policy, modules or {}):
        log.info("precision.modules: %s", line)
    return factory


def module_lines(policy: PrecisionPolicy, modules: Mapping[str, tuple[int, str]]) -> list[str]:
    """One line per precision.modules pattern: the preset and the linears it decides (in a run's log and plan)."""
    lines = []
    for pattern, names in policy.module_assignments(modules).items():
        preset = policy.module_policies()[pattern]
        what = preset.name or preset.format
        count = f"{len(names)} linear{'s' if len(names) != 1 else ''}"
        lines.append(f"{pattern} -> {what}: {count} ({compact_names(names)})")
    return lines


def compact_names(names: list[str]) -> str:
    """Module names with the block index gathered: blocks.0.mixer.in_proj, blocks.2.mixer.in_proj ->
    blocks.{0,2}.mixer.in_proj (names without a block index as they are)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name in names:
        head, sep, rest = name.partition(".")
        index, _, tail = rest.partition(".")
        key = (head, tail) if sep and index.isdigit() else (name, "")
        groups.setdefault(key, []).append(index if key[1] else "")
    parts = []
    for (head, tail), indices in groups.items():
        if not tail:
            parts.append(head)
        else:
            parts.append(f"{head}.{indices[0] if len(indices) == 1 else '{' + ','.join(indices) + '}'}.{tail}")
    return ", ".join(parts) if parts else "none"


def quant_linears(model: nn.Module) -> list[QuantLinear]:
    """`model`'s linears that run through this package's custom ops (`QuantLinear`), in module order: each keeps
    a weight cache, draws from SR generators of its own and names its recipe in `recipe_key`, which the
    optimizer's post-step hook (a new weight epoch) and a CUDA graph capture look after (Transformer
    Engine's layers keep their own state). So a caller asks this package, not the layers' classes."""
    return [m for m in model.modules() if isinstance(m, QuantLinear)]


def bump_weight_epochs(layers) -> None:
    """A new weight epoch (`linear.WeightEpoch`) for every QuantLinear in `layers` (each distinct epoch bumped
    once): their cached quantized weights are freed and the next training use quantizes afresh."""
    epochs = {id(layer.weight_epoch): layer.weight_epoch for layer in layers if isinstance(layer, QuantLinear)}
    for epoch in epochs.values():
        epoch.bump()


def weights_changed(model: nn.Module) -> None:
    """Call after changing the weights of `model`'s precision linears outside `optimizer.step()` and
    `load_state_dict` (`weight.copy_(...)`, `weight.data = ...`, an update by hand) before its next training
    forward: a new weight epoch, so the quantized weights cached in the old one are not reused. Evaluation
    forwards (no_grad) never read it (an evaluation caches into its own: `weights_quantized_once`). The
    optimizer's post-step hook (`weights_changed_after_each_step`), loads, precision switches and CUDA graph
    captures bump the epoch themselves."""
    bump_weight_epochs(quant_linears(model))


def weights_changed_after_each_step(optimizer, model: nn.Module) -> None:
    """Register a bump of the weight epoch of `model`'s quantized linears as `optimizer`'s post-step hook: what
    keeps their cached quantized weights fresh whatever the optimizer writes through (torch's fused AdamW does
    not bump version counters, FSDP2 gathers into fresh storage), also for a caller that drives the optimizer
    without a controller (a benchmark, a library user)."""
    quantized = quant_linears(model)
    if quantized:
        optimizer.register_step_post_hook(lambda *_: bump_weight_epochs(quantized))


# Held-out evaluation (train/heldout.py) in BF16 or in the training precision, leaving training's state as it was
@contextlib.contextmanager
def bf16_linears(layers):
    """The precision linears `layers` run their GEMMs in BF16 inside the block (as after a full switch)."""
    saved = []
    for layer in layers:
        if isinstance(layer, QuantLinear):  # a plain flag its forward reads (False: F.linear under autocast)
            saved.append((layer, "quantized", layer.quantized))
            layer.quantized = False
        else:  # TELinear: `quantized` follows `switched`
            saved.append((layer, "switched", layer.switched))
            layer.switched = True
    try:
        yield
    finally:
        for layer, attr, value in saved:
            setattr(layer, attr, value)


@contextlib.contextmanager
def weights_quantized_once(layers):
    """Inside the block (an evaluation: the weights do not change in it), each QuantLinear of `layers`
    quantizes its weight at most once per operand form, at its first forward without grad, and its other such
    forwards reuse those bits (the bits a fresh quantization gives: the same weight, the same round-to-nearest
    quantizer; stochastically rounded weights still draw at every use). They live in a `WeightEpoch` of the
    block's own (`WeightCache.eval_epoch`), freed when it ends: training's cached operands are neither read nor
    replaced, and a weight changed by hand before the block is quantized as it is now. A layer whose cache is
    off (`PrecisionController(cache_weights=False)`) quantizes at every forward."""
    epoch = WeightEpoch()
    caches = [layer.weight_cache for layer in layers if isinstance(layer, QuantLinear)]
    saved = [cache.eval_epoch for cache in caches]
    for cache in caches:
        cache.eval_epoch = epoch
    try:
        yield
    finally:
        for cache, previous in zip(caches, saved):
            cache.eval_epoch = previous
        epoch.bump()  # the evaluation's operands freed now, not when the epoch object goes


@contextlib.contextmanager
def training_state_kept(layers):
    """Inside the block, a forward of the precision linears `layers` leaves what training reads as it found
    it: telemetry is off (it describes the training GEMMs), and the SR streams a quantized forward draws from
    (precision.sr=all) are rewound afterwards, so that an evaluation does not change the
    rounding of the steps after it."""
    saved = []
    for layer in layers:
        draws = isinstance(layer, QuantLinear) and layer.quantized  # (TELinear: TE draws from torch's generator)
        draws = draws and any(getattr(layer.recipe, role).rounding == "sr" for role in FORWARD_ROLES)
        saved.append((layer, layer.stats_enabled, layer.sr.positions() if draws else None))
        layer.stats_enabled = False
    try:
        yield
    finally:
        for layer, stats_enabled, positions in saved:
            layer.stats_enabled = stats_enabled
            if positions is not None:
                layer.sr.rewind(positions)


class PrecisionController:
    """Applies the precision schedule and gathers telemetry for every factory-built linear."""

    def __init__(self, policy: PrecisionPolicy, model: nn.Module, cache_weights: bool = True):
        self.policy = policy
        self.layers = [m for _, m in model.named_modules() if isinstance(m, PrecisionLinear)]
        backends = sorted({m.backend_name for m in self.layers})
        if len(backends) > 1:
            raise ValueError(f"PrecisionController: the model mixes backends {backends}")
        if backends:
            self.backend_name = backends[0]
            self.backend_reason = getattr(self.layers[0], "backend_reason", "")
        else:
            backend, self.backend_reason = resolve_backend(policy)
            self.backend_name = backend.name
        # What precision.modules decided, for the run's plan: one line per pattern, the linears by the names the
        # factory resolved them by (the model's own, whatever wraps it later)
        named = {m.module_name: (m.block_index, m.name) for m in self.layers if getattr(m, "module_name", None)}
        self.module_lines = module_lines(policy, named) if policy.modules else []
        labels = [m.label for m in self.layers]
        if len(set(labels)) != len(labels):
            raise ValueError("PrecisionController: two linears share a (block_index, name) label")
        self.switched = False
        self.switched_at: float | None = None
        self.steps = 0  # on_step calls so far
        # The controller bumps the weight epoch (on_step, weights_changed, load_state_dict), so it turns the weight
        # caches on; its linears share one epoch (the factory's, else one it makes for linears built one by one).
        quantized = [m for m in self.layers if isinstance(m, QuantLinear)]
        epochs = {id(m.weight_epoch) for m in quantized}
        self.weight_epoch = quantized[0].weight_epoch if len(epochs) == 1 else WeightEpoch()
        for layer in quantized:
            layer.weight_epoch = self.weight_epoch
            layer.cache_weights = cache_weights
        log.info("precision controller: %d linears, backend %s", len(self.layers), self.backend_name)  # reason: above

    # ------------------------------------------------------------------ per step
    def on_step(self, tokens_fraction: float) -> str | None:
        """Call once per optimizer step, before its forward passes. Switches to BF16 when the
        schedule says so (returns a message then), enables telemetry every `stats_every` steps, and
        starts a new weight epoch (`weights_changed`: for an optimizer without the post-step hook, e.g.
        DeepSpeed's)."""
        self.weights_changed()
        every = self.policy.stats_every
        collect = every > 0 and self.steps % every == 0
        for layer in self.layers:
            layer.stats_enabled = collect
        self.steps += 1
        if not self.switched and self.policy.switch_due(tokens_fraction):
            self._apply_switch(True)
            self.switched_at = float(tokens_fraction)
            return (
                f"precision: switched {self.policy.switch.mode} to BF16 at tokens fraction "
                f"{tokens_fraction:.4f} (scheduled at {self.policy.switch.at_fraction})"
            )
        return None

    def weights_changed(self) -> None:
        """A new weight epoch for every linear: their cached quantized weights are freed, and each
        quantizes its weight once more (at its first training forward) for every micro-batch's Fprop and
        Dgrad to reuse. Call it after changing weights outside `optimizer.step()` and `load_state_dict`;
        `on_step`, `load_state_dict` and the optimizer's post-step hook (`weights_changed_after_each_step`,
        which the training engine installs) bump it themselves. The cache never looks at the weight's
        version counter or storage."""
        self.weight_epoch.bump()

    def _apply_switch(self, switched: bool) -> None:
        self.switched = switched
        for layer in self.layers:
            layer.set_switched(switched)  # a QuantLinear whose recipe changes bumps the weight epoch

    def quant_stats(self) -> dict[str, float]:
        """Telemetry gathered since the last call, flat: quant/<layer>/<operand>/<stat>."""
        out = {}
        for layer in self.layers:
            for key, value in layer.pop_stats().items():
                out[f"quant/{layer.label}/{key}"] = value
        return out

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        generators = {}
        for layer in self.layers:
            states = layer.generator_state()
            if states:
                generators[layer.label] = {role: t.clone() for role, t in states.items()}
        return {
            "switched": self.switched,
            "switched_at": -1.0 if self.switched_at is None else self.switched_at,
            "steps": self.steps,
            "generators": generators,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"switched", "switched_at", "steps", "generators"} - set(state)
        if missing:
            raise ValueError(f"PrecisionController.load_state_dict: missing key(s) {sorted(missing)}")
        self._apply_switch(bool(state["switched"]))
        self.switched_at = None if state["switched_at"] < 0 else float(state["switched_at"])
        self.steps = int(state["steps"])
        self.weights_changed()
        generators = state["generators"]
        for layer in self.layers:
            layer.load_generator_state(generators.get(layer.label))
