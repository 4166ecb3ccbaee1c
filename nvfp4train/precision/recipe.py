"""The precision policy and the per-layer recipes it resolves to, as frozen objects: which format each
operand of each linear-layer GEMM uses.

A linear layer Y = X Wᵀ runs three GEMMs, each with two operands (arXiv 2509.25149 §4, Fig. 5):

    Fprop  Y  = X  · Wᵀ     operands fprop_x  [tokens, in]   fprop_w  [out, in]     (K = in)
    Dgrad  dX = dY · W      operands dgrad_dy [tokens, out]  dgrad_w  [in, out]     (K = out)
    Wgrad  dW = dYᵀ · X     operands wgrad_dy [out, tokens]  wgrad_x  [in, tokens]  (K = tokens)

Every operand is written in its GEMM layout, rows × K, so "tile (1, 16)" always means 16
consecutive elements along that GEMM's contraction dimension. A `PrecisionPolicy` (plain data,
built from the Hydra `precision` group) resolves, for a block index and a schedule phase, to a
`LayerRecipe`: one `OperandSpec` per operand role.

Knobs are independent: rht on wgrad|all|none, sr on grads|all|none, weight tile, BF16 first/last
blocks (bf16_first, bf16_last: a count or a fraction), a mid-run switch to BF16
(full|forward_only|backward_only), and the same one-sided BF16 for the whole run: backward_override
(TE's: high_precision, dequantized) and forward_override (the paper's App. D forward-only BF16).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nvfp4train.config.schema import ConfigError, bounded, check, parse, to_plain
from nvfp4train.formats import scale_rules

ROLES = ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x")
FORWARD_ROLES = ("fprop_x", "fprop_w")
BACKWARD_ROLES = ("dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x")
GRADIENT_ROLES = ("dgrad_dy", "wgrad_dy")

# The values each PrecisionPolicy key with a fixed set of choices takes.
Format = StrEnum("Format", "bf16 fp8_blockwise fp8_tensorwise nvfp4 mxfp4")
Backend = StrEnum("Backend", "auto emulated scaled_mm te")
Rht = StrEnum("Rht", "wgrad all none")
Sr = StrEnum("Sr", "grads all none")
SwitchMode = StrEnum("SwitchMode", "full forward_only backward_only")
# TE's nvfp4_4over6 scopes, plus ours: *_fprop puts 4over6 on the activations' Fprop copy only, so their
# Wgrad copy keeps the RHT (TE refuses 4over6 on an RHT'd operand, hence on its whole activation quantizer).
FourOverSix = StrEnum("FourOverSix", "none weights activations all activations_fprop all_fprop")
FourOverSixErr = StrEnum("FourOverSixErr", "mae mse")
# TE's backward_override: the backward GEMMs in BF16 on the original operands (high_precision) or on the Fprop
# operands' quantized values, dequantized (dequantized); dY is never quantized under either.
BackwardOverride = StrEnum("BackwardOverride", "none high_precision dequantized")
# Its opposite (paper App. D, TE issue #2569): Fprop in BF16, Dgrad and Wgrad quantized.
ForwardOverride = StrEnum("ForwardOverride", "none high_precision")
# MXFP4 block-scale rules, named as torchao names them (formats/mxfp4.py; listed in formats/scale_rules.py, which
# imports no torch): "rceil" rounds the scale up (the paper's rule), "floor" is OCP MX.
Mxfp4ScaleRule = StrEnum("Mxfp4ScaleRule", " ".join(scale_rules.SCALE_RULES))
FORMATS, BACKENDS, RHT_CHOICES, SR_CHOICES = tuple(Format), tuple(Backend), tuple(Rht), tuple(Sr)
SWITCH_MODES, MXFP4_SCALE_RULES = tuple(SwitchMode), tuple(Mxfp4ScaleRule)

# Weight tiles each format accepts (rows x K of the Fprop weight operand) and its default.
WEIGHT_TILES = {
    "bf16": ("none",),
    "fp8_tensorwise": ("tensor",),
    "fp8_blockwise": ("128x128", "1x128"),
    "nvfp4": ("16x16", "1x16"),
    "mxfp4": ("1x32",),
}
DEFAULT_WEIGHT_TILE = {
    "bf16": "none",
    "fp8_tensorwise": "tensor",
    "fp8_blockwise": "128x128",
    "nvfp4": "16x16",
    "mxfp4": "1x32",
}
# Block length along K of the activation/gradient operands (1 x block).
ACTIVATION_BLOCK = {"fp8_blockwise": 128, "nvfp4": 16, "mxfp4": 32}
DEFAULT_RHT_DIM = {"nvfp4": 16, "mxfp4": 32}


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized. `tile` is (rows, K) in the operand's GEMM layout;
    None for per-tensor scaling and for bf16. `rht_dim` > 0 applies a random Hadamard transform
    of that size along K before quantizing (both operands of that GEMM get the same one)."""

    format: str  # "bf16" | "nvfp4" | "mxfp4" | "fp8_e4m3" | "fp8_e5m2"
    tile: tuple[int, int] | None = None
    rounding: str = "rne"  # "rne" | "sr"
    rht_dim: int = 0
    # mxfp4: "rceil" | "floor"; fp8 blockwise: "pow2" | "fp32"; bf16: "dequantized" (DEQUANTIZED_OPERAND); else ""
    scale_mode: str = ""
    # nvfp4 only, TE's newer options (formats/nvfp4.py): "mae" | "mse" | "" (off); the E4M3 bound; per-row scales
    four_over_six: str = ""
    scale_bound: int = 448
    row_scaled: bool = False

    @property
    def nvfp4_options(self) -> dict:
        """The keyword arguments nvfp4.quantize / fake_quantize take for this operand's TE options."""
        if not self.four_over_six and not self.row_scaled:
            return {}
        return {
            "four_over_six": self.four_over_six or None,
            "scale_bound": self.scale_bound,
            "row_scaled": self.row_scaled,
        }

    @property
    def is_bf16(self) -> bool:
        return self.format == "bf16"

    @property
    def k_block(self) -> int:
        """Granularity along K that the operand's K length must be padded to."""
        sizes = [1]
        if self.tile is not None:
            sizes.append(self.tile[1])
        if self.rht_dim:
            sizes.append(self.rht_dim)
        return math.lcm(*sizes)

    @property
    def row_block(self) -> int:
        return self.tile[0] if self.tile is not None else 1

    def describe(self) -> str:
        if self.is_bf16:
            return "bf16 (dequantized Fprop operand)" if self.scale_mode == DEQUANTIZED else "bf16"
        tile = "tensor" if self.tile is None else f"{self.tile[0]}x{self.tile[1]}"
        rht = f" rht{self.rht_dim}" if self.rht_dim else ""
        fos = f" 4over6-{self.four_over_six} b{self.scale_bound}" if self.four_over_six else ""
        rows = " row-scaled" if self.row_scaled else ""
        return f"{self.format} {tile} {self.rounding}{rht}{fos}{rows}"


BF16_OPERAND = OperandSpec("bf16")
# backward_override=dequantized: a BF16 backward operand made of the Fprop operand's quantized values (dgrad_w:
# Fprop's W, wgrad_x: Fprop's X), dequantized to BF16, not of the original tensor.
DEQUANTIZED = "dequantized"
DEQUANTIZED_OPERAND = OperandSpec("bf16", scale_mode=DEQUANTIZED)


@dataclass(frozen=True)
class LayerRecipe:
    """One OperandSpec per role (see ROLES)."""

    fprop_x: OperandSpec = BF16_OPERAND
    fprop_w: OperandSpec = BF16_OPERAND
    dgrad_dy: OperandSpec = BF16_OPERAND
    dgrad_w: OperandSpec = BF16_OPERAND
    wgrad_dy: OperandSpec = BF16_OPERAND
    wgrad_x: OperandSpec = BF16_OPERAND

    @property
    def all_bf16(self) -> bool:
        return all(getattr(self, r).is_bf16 for r in ROLES)

    @property
    def forward_bf16(self) -> bool:
        return self.fprop_x.is_bf16 and self.fprop_w.is_bf16

    @property
    def reuses_fprop_weight(self) -> bool:
        """Dgrad uses the Fprop weight quantization (transposed) when the two specs are the same
        square tile without RHT: a square tile's scale covers the same elements either way, so
        the two quantizations are bit-identical transposes (arXiv 2509.25149 §4.3)."""
        w, wt = self.fprop_w, self.dgrad_w
        # 4over6 re-sums a 16x16 tile's errors in the transposed order for W.T, so its copies are quantized
        # separately (TE's columnwise copy), not assumed to be transposes (both from one pass: pairs.weight_pair).
        return (
            not w.is_bf16
            and w == wt
            and w.tile is not None
            and w.tile[0] == w.tile[1]
            and w.rht_dim == 0
            and not w.four_over_six
        )

    def with_bf16(self, roles) -> LayerRecipe:
        return dataclasses.replace(self, **{r: BF16_OPERAND for r in roles})

    def describe(self) -> dict[str, str]:
        return {r: getattr(self, r).describe() for r in ROLES}


@dataclass(frozen=True)
class SwitchConfig:
    """Switch to BF16 once `tokens_fraction >= at_fraction` (paper App. D)."""

    at_fraction: float | None = bounded(None, ge=0, le=1)
    """Fraction of the training tokens at which to switch; null: never (e.g. 0.82 with forward_only)."""
    mode: SwitchMode = SwitchMode.full
    """Which GEMMs switch to BF16: all (full), Fprop only (forward_only) or Dgrad and Wgrad (backward_only)."""

    def __post_init__(self):
        check(self, "precision.switch")


# A run's saved config (config.yaml, a checkpoint's meta.json, a W&B run) records the precision section as it
# was then. Before one BF16-blocks knob per side, a side took two keys, a count and a fraction (set one, the
# other 0). The user-facing config accepts only today's keys; the tools that read records translate them.
RETIRED_BF16_KEYS = {
    "bf16_first": ("bf16_first_blocks", "bf16_first_fraction"),
    "bf16_last": ("bf16_last_blocks", "bf16_last_fraction"),
}


def recorded_precision(section: Mapping[str, Any]) -> dict[str, Any]:
    """A saved run config's precision section in today's keys: bf16_{side}_blocks / bf16_{side}_fraction
    become bf16_{side} (the fraction where it is set, else the count); anything else is left as it is."""
    out = dict(section)
    for key, (count_key, fraction_key) in RETIRED_BF16_KEYS.items():
        if count_key in out or fraction_key in out:
            count, fraction = out.pop(count_key, 0), out.pop(fraction_key, 0)
            out.setdefault(key, fraction if fraction else count)
    return out


def recorded_run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A saved run config with its precision section read by `recorded_precision`."""
    out = dict(config)
    if isinstance(out.get("precision"), Mapping):
        out["precision"] = recorded_precision(out["precision"])
    return out


def _tile(text: str) -> tuple[int, int] | None:
    if text in ("tensor", "none"):
        return None
    rows, cols = text.split("x")
    return int(rows), int(cols)


@dataclass(frozen=True)
class PrecisionPolicy:
    """Plain-data precision policy. Build with `PrecisionPolicy.from_dict(cfg)` (validates)."""

    format: Format = Format.bf16
    """Number format of the quantized linears' GEMM operands."""
    backend: Backend = Backend.auto
    """auto (te where installed and supported, else scaled_mm for FP8 on sm_89+, else emulated) |
    emulated (any device) | scaled_mm (FP8 tensor cores) | te (Transformer Engine)."""
    weight_tile: str | None = None
    """Scale tile of the weights, rows x K: 16x16 (2D: Fprop and Dgrad see the same bits) or 1x16 for nvfp4,
    128x128 or 1x128 for fp8_blockwise; null: the format's default (DEFAULT_WEIGHT_TILE)."""
    rht: Rht = Rht.none
    """Random Hadamard transform on the Wgrad operands (wgrad), on every operand (all), or none."""
    rht_dim: int | None = None
    """Size of the Hadamard transform, a power of two in [2, 256]; null: 16 for nvfp4, 32 for mxfp4."""
    sr: Sr = Sr.none
    """Stochastic rounding on the gradients (grads), on every operand (all), or none (round to nearest even)."""
    mxfp4_scale_rule: Mxfp4ScaleRule = Mxfp4ScaleRule.rceil
    """MXFP4 E8M0 scale rounding: rceil (round up, the paper's App. B.4; torchao RCEIL) or floor (OCP)."""
    fp8_pow2_scales: bool = True
    """fp8_blockwise: power-of-two FP32 scales (DeepSeek-V3, TE Float8BlockScaling)."""
    bf16_first: float = bounded(0, ge=0)
    """BF16 blocks at the start of the model: a whole number counts blocks (2: blocks 0 and 1), a number in
    (0, 1) is a fraction of the blocks, rounded half up (0.03 of the 12B's 62 blocks: its first 2)."""
    bf16_last: float = bounded(0, ge=0)
    """BF16 blocks at the end of the model, as bf16_first (0.13 of 62 blocks: the last 8)."""
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    """A mid-run switch to BF16."""
    four_over_six: FourOverSix = FourOverSix.none
    """nvfp4 "4over6" (TE's nvfp4_4over6): each block quantized with its max mapped to 6 and to 4, the smaller
    error kept. weights (fprop_w, dgrad_w) | activations (fprop_x and wgrad_x: needs rht none) | all (both) |
    ours, beyond TE: activations_fprop / all_fprop (fprop_x only: wgrad_x keeps its RHT) | none. Never gradients."""
    four_over_six_err_mode: FourOverSixErr = FourOverSixErr.mae
    """4over6's block error: mae (TE's default) or mse."""
    four_over_six_scale_bound: int = 256
    """E4M3 bound in the global scale of the 4over6 operands: 256 (TE's default) or 448."""
    row_scaled_activation: bool = False
    """nvfp4: one FP32 scale per token for the activations' Fprop copy (fprop_x), TE's row_scaled_activation."""
    backward_override: BackwardOverride = BackwardOverride.none
    """TE's backward_override for the whole run: none (quantized backward) | high_precision (Dgrad and Wgrad in
    BF16 on the original W, X and dY: the backward_only switch from step 0) | dequantized (Dgrad and Wgrad in
    BF16 on the Fprop operands' quantized values, dequantized, and dY unquantized)."""
    forward_override: ForwardOverride = ForwardOverride.none
    """The opposite: high_precision runs Fprop in BF16 for the whole run and keeps Dgrad and Wgrad quantized
    (paper App. D; the forward_only switch from step 0) | none."""
    stats_every: int = bounded(0, ge=0)
    """Collect quantization telemetry every N steps; 0: never."""
    name: str = ""
    """The preset's name, for logs."""
    modules: dict[str, PrecisionPolicy] = field(default_factory=dict, hash=False)
    """Per-module precision on top of the rest of this section: a glob pattern over the model's linear module names
    (`blocks.3.mixer.in_proj`; fnmatch: `*` matches any text, dots included, `?` one character) -> a precision
    preset (its name in a config, e.g. `*.in_proj: bf16`; config.yaml records the preset's keys). A linear that
    patterns match runs the GEMMs of the last one that matches, whatever bf16_first / bf16_last say of its block;
    the preset gives its format and operand keys, and the run-wide keys (backend, switch, stats_every) stay this
    section's."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> PrecisionPolicy:
        """Build and validate. Raises ConfigError naming the key and the allowed values."""
        return parse(cls, cfg or {}, "precision")

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def __post_init__(self):
        check(self, "precision")
        tile = self.resolved_weight_tile
        if tile not in WEIGHT_TILES[self.format]:
            raise ConfigError(
                f"precision.weight_tile={tile!r} is not allowed with format {self.format}; "
                f"choose one of {list(WEIGHT_TILES[self.format])}"
            )
        if self.format.startswith("fp8"):
            # The FP8 baselines are RNE without RHT (TE Float8BlockScaling / Float8CurrentScaling).
            if self.sr != "none":
                raise ConfigError(
                    f"precision.sr={self.sr.value!r} is not allowed with format {self.format}; choose 'none'"
                )
            if self.rht != "none":
                raise ConfigError(
                    f"precision.rht={self.rht.value!r} is not allowed with format {self.format}; choose 'none'"
                )
        if self.rht != "none":
            d = self.resolved_rht_dim
            if not (d >= 2 and d & (d - 1) == 0 and d <= 256):
                raise ConfigError(f"precision.rht_dim={d!r} is not allowed; choose a power of two in [2, 256]")
        self._check_te_options()
        self._check_overrides()
        self._check_modules()
        for key in ("bf16_first", "bf16_last"):
            value = getattr(self, key)
            if value >= 1 and value != int(value):
                raise ConfigError(
                    f"precision.{key}={value!r}: a block count is a whole number, a fraction is in (0, 1)"
                )
            if value == int(value):  # a count: kept an int, so the saved config reads as it was written
                object.__setattr__(self, key, int(value))

    def _check_te_options(self) -> None:
        """TE's refusals for 4over6 and row scaling (RHT, SR, formats), and ours (one line each)."""
        fos, rht, sr = self.four_over_six.value, self.rht.value, self.sr.value
        if self.four_over_six_scale_bound not in (256, 448):
            raise ConfigError(
                f"precision.four_over_six_scale_bound={self.four_over_six_scale_bound!r} is not allowed; "
                "choose 256 or 448"
            )
        if (fos != "none" or self.row_scaled_activation) and self.format != "nvfp4":
            key = "four_over_six" if fos != "none" else "row_scaled_activation"
            raise ConfigError(f"precision.{key} is an nvfp4 option; format is {self.format.value} (choose none/false)")
        if fos in ("activations", "all") and rht != "none":
            raise ConfigError(
                f"precision.four_over_six={fos!r} needs rht='none' (TE refuses 4over6 on the RHT'd Wgrad copy of "
                f"the activations); with rht={rht!r} choose 'none', 'weights' or ours 'activations_fprop', 'all_fprop'"
            )
        if fos != "none" and rht == "all":
            raise ConfigError(
                f"precision.four_over_six={fos!r} is not allowed with rht='all' (4over6 never runs on an RHT'd "
                "operand); choose four_over_six 'none' or rht 'wgrad'/'none'"
            )
        if (fos != "none" or self.row_scaled_activation) and sr == "all":
            key = "four_over_six" if fos != "none" else "row_scaled_activation"
            raise ConfigError(
                f"precision.{key} is not allowed with sr='all' (TE refuses 4over6 and row scaling with "
                "stochastic rounding); choose sr 'grads' or 'none'"
            )
        if self.row_scaled_activation and rht == "all":
            raise ConfigError(
                "precision.row_scaled_activation is not allowed with rht='all' (TE refuses row scaling with the "
                "RHT); choose rht 'wgrad' or 'none'"
            )

    def _check_overrides(self) -> None:
        bwd, fwd = self.backward_override.value, self.forward_override.value
        key = "backward_override" if bwd != "none" else "forward_override"
        if (bwd != "none" or fwd != "none") and self.format == "bf16":
            raise ConfigError(f"precision.{key} needs a quantized format; format is bf16 (choose none)")
        if bwd != "none" and fwd != "none":
            raise ConfigError(
                f"precision.backward_override={bwd!r} with forward_override={fwd!r} leaves no GEMM quantized; "
                "set one of them to 'none' (or format bf16)"
            )
        if bwd == "dequantized" and self.sr == "all":
            raise ConfigError(
                "precision.backward_override='dequantized' is not allowed with sr='all' (Dgrad re-reads Fprop's "
                "weight quantization, which stochastic rounding would not repeat); choose sr 'grads' or 'none'"
            )

    def _check_modules(self) -> None:
        """What a module's preset cannot change: the run's backend and switch (one for every linear), and it
        holds no modules of its own. Its effective policy (`for_module`) is made once here."""
        effective = {}
        for pattern, module in self.modules.items():
            key = f"precision.modules.{pattern}"
            if not pattern:
                raise ConfigError("precision.modules: an empty pattern; allowed: a glob over the module names")
            if module.modules:
                raise ConfigError(f"{key}: the preset has precision.modules of its own; allowed: a preset without")
            if module.backend not in ("auto", self.backend):
                raise ConfigError(
                    f"{key}={module.name or module.format.value!r} sets backend={module.backend.value!r}: one backend "
                    f"runs every linear of a run (precision.backend={self.backend.value!r}); allowed: a preset with "
                    "backend auto, or set precision.backend"
                )
            if module.switch.at_fraction is not None and module.switch != self.switch:
                raise ConfigError(
                    f"{key}={module.name or module.format.value!r} has a switch to BF16 at "
                    f"{module.switch.at_fraction:g}: the switch is one schedule for every linear of a run; allowed: a "
                    "preset without a switch (set precision.switch instead)"
                )
            # the preset's GEMM numerics; its own BF16 blocks do not apply (the pattern chose the linears)
            effective[pattern] = dataclasses.replace(
                module,
                bf16_first=0,
                bf16_last=0,
                backend=self.backend,
                switch=self.switch,
                stats_every=self.stats_every,
            )
        object.__setattr__(self, "_module_policies", effective)

    # ------------------------------------------------------------------ per-module precision
    def module_pattern(self, module_name: str | None) -> str | None:
        """The precision.modules pattern that decides linear `module_name` (the last that matches), or None."""
        if module_name is None:
            return None
        matched = [p for p in self.modules if fnmatch.fnmatchcase(module_name, p)]
        return matched[-1] if matched else None

    def for_module(self, module_name: str | None) -> PrecisionPolicy:
        """The policy linear `module_name` runs: its precision.modules preset (without BF16 blocks, with this
        policy's backend, switch and telemetry), or this policy where no pattern matches it (or no name is given)."""
        pattern = self.module_pattern(module_name)
        return self if pattern is None else self._module_policies[pattern]

    def module_policies(self) -> dict[str, PrecisionPolicy]:
        """{pattern: the policy the linears it decides run}, in precision.modules' order."""
        return dict(self._module_policies)

    def check_module_names(self, module_names: Iterable[str]) -> None:
        """Each precision.modules pattern must match a linear of the model (a typo would otherwise change nothing)."""
        names = list(module_names)
        for pattern in self.modules:
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                shown = ", ".join(names[:4]) + (f", ... {names[-1]}" if len(names) > 4 else "")
                raise ConfigError(
                    f"precision.modules.{pattern}: the pattern matches no linear of the model; allowed: a glob over "
                    f"its linears' names ({len(names)}: {shown}), e.g. *.in_proj or blocks.3.*"
                )

    def module_assignments(self, module_names: Iterable[str]) -> dict[str, list[str]]:
        """{pattern: the linears it decides}, in precision.modules' order (a linear under its last match)."""
        out: dict[str, list[str]] = {p: [] for p in self.modules}
        for name in module_names:
            pattern = self.module_pattern(name)
            if pattern is not None:
                out[pattern].append(name)
        return out

    # ------------------------------------------------------------------ derived values
    @property
    def resolved_weight_tile(self) -> str:
        return self.weight_tile if self.weight_tile is not None else DEFAULT_WEIGHT_TILE[self.format]

    @property
    def resolved_rht_dim(self) -> int:
        return self.rht_dim if self.rht_dim is not None else DEFAULT_RHT_DIM.get(self.format, 16)

    def bf16_block_counts(self, n_blocks: int) -> tuple[int, int]:
        """(first, last) numbers of blocks kept in BF16 for a model of n_blocks blocks."""

        def count(value):
            if 0 < value < 1:
                return min(n_blocks, math.floor(value * n_blocks + 0.5))
            return min(n_blocks, int(value))

        return count(self.bf16_first), count(self.bf16_last)

    def is_bf16_block(self, block_index: int, n_blocks: int) -> bool:
        if not 0 <= block_index < n_blocks:
            raise ValueError(f"block_index={block_index} is outside 0..{n_blocks - 1}")
        first, last = self.bf16_block_counts(n_blocks)
        return block_index < first or block_index >= n_blocks - last

    def quantized_recipe(self) -> LayerRecipe:
        """The recipe of a quantized (non-BF16) block, before any schedule switch."""
        fmt = self.format
        if fmt == "bf16":
            return LayerRecipe()
        if fmt == "fp8_tensorwise":
            # Current scaling, HYBRID: E4M3 for weights and activations, E5M2 for gradients.
            e4, e5 = OperandSpec("fp8_e4m3"), OperandSpec("fp8_e5m2")
            return LayerRecipe(fprop_x=e4, fprop_w=e4, dgrad_dy=e5, dgrad_w=e4, wgrad_dy=e5, wgrad_x=e4)

        block = ACTIVATION_BLOCK[fmt]
        elem = "fp8_e4m3" if fmt == "fp8_blockwise" else fmt
        wtile = _tile(self.resolved_weight_tile)
        rht_dim = self.resolved_rht_dim
        rht_all = rht_dim if self.rht == "all" else 0
        rht_wgrad = rht_dim if self.rht in ("wgrad", "all") else 0
        sr_grads = "sr" if self.sr in ("grads", "all") else "rne"
        sr_other = "sr" if self.sr == "all" else "rne"
        act = (1, block)
        mode = {
            "mxfp4": scale_rules.check_scale_rule(self.mxfp4_scale_rule),
            "fp8_blockwise": "pow2" if self.fp8_pow2_scales else "fp32",
        }.get(fmt, "")

        def spec(tile, rounding, rht):
            return OperandSpec(elem, tile, rounding, rht, mode)

        recipe = LayerRecipe(
            fprop_x=spec(act, sr_other, rht_all),
            fprop_w=spec(wtile, sr_other, rht_all),
            dgrad_dy=spec(act, sr_grads, rht_all),
            dgrad_w=spec(wtile, sr_other, rht_all),
            wgrad_dy=spec(act, sr_grads, rht_wgrad),
            wgrad_x=spec(act, sr_other, rht_wgrad),
        )
        recipe = self._with_te_options(recipe) if fmt == "nvfp4" else recipe
        return self._with_overrides(recipe)

    def _with_overrides(self, recipe: LayerRecipe) -> LayerRecipe:
        """backward_override / forward_override: one side's GEMMs in BF16 for the whole run."""
        if self.forward_override == "high_precision":
            return recipe.with_bf16(FORWARD_ROLES)
        if self.backward_override == "high_precision":
            return recipe.with_bf16(BACKWARD_ROLES)
        if self.backward_override == "dequantized":
            recipe = recipe.with_bf16(GRADIENT_ROLES)
            return dataclasses.replace(recipe, dgrad_w=DEQUANTIZED_OPERAND, wgrad_x=DEQUANTIZED_OPERAND)
        return recipe

    def _with_te_options(self, recipe: LayerRecipe) -> LayerRecipe:
        """4over6 on the roles its scope names (never gradients), row scaling on fprop_x."""
        fos = self.four_over_six.value
        roles = {
            "none": (),
            "weights": ("fprop_w", "dgrad_w"),
            "activations": ("fprop_x", "wgrad_x"),
            "all": ("fprop_w", "dgrad_w", "fprop_x", "wgrad_x"),
            "activations_fprop": ("fprop_x",),
            "all_fprop": ("fprop_w", "dgrad_w", "fprop_x"),
        }[fos]
        changes = {
            role: dataclasses.replace(
                getattr(recipe, role),
                four_over_six=self.four_over_six_err_mode.value,
                scale_bound=self.four_over_six_scale_bound,
            )
            for role in roles
        }
        if self.row_scaled_activation:
            changes["fprop_x"] = dataclasses.replace(changes.get("fprop_x", recipe.fprop_x), row_scaled=True)
        return dataclasses.replace(recipe, **changes)

    def layer_recipe(self, block_index: int, n_blocks: int, switched: bool = False) -> LayerRecipe:
        """The recipe a linear of block `block_index` runs, given whether the schedule switch is on."""
        if self.is_bf16_block(block_index, n_blocks):
            return LayerRecipe()
        recipe = self.quantized_recipe()
        if switched:
            roles = {"full": ROLES, "forward_only": FORWARD_ROLES, "backward_only": BACKWARD_ROLES}[self.switch.mode]
            recipe = recipe.with_bf16(roles)
        return recipe

    def summary(self, n_blocks: int) -> str:
        """One line for the run log: BF16 blocks, the per-operand recipe, the switch."""
        if self.format == "bf16":
            return "bf16: every linear in BF16"
        first, last = self.bf16_block_counts(n_blocks)
        bf16 = sum(self.is_bf16_block(i, n_blocks) for i in range(n_blocks))
        ops = ", ".join(f"{role}={spec}" for role, spec in self.quantized_recipe().describe().items())
        switch = (
            "no switch"
            if self.switch.at_fraction is None
            else f"switch {self.switch.mode} to BF16 at {self.switch.at_fraction:g} of tokens"
        )
        return (
            f"{self.name or self.format}: BF16 blocks first {first} + last {last} of {n_blocks} "
            f"({100 * bf16 / n_blocks:.1f}% of blocks); {ops}; {switch}"
        )

    def switch_due(self, tokens_fraction: float) -> bool:
        at = self.switch.at_fraction
        return at is not None and tokens_fraction >= at
