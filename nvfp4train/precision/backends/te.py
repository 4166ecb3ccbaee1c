"""Transformer Engine backend: the same policy as TE modules and recipes.

`transformer_engine` itself is imported only when a TE layer is built: nothing else in the
package depends on it (`backends.TE` is this module's `TEBackend`). Mapping onto TE's recipes
(https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/api/common.html):

    fp8_blockwise  -> Float8BlockScaling(fp8_format=E4M3)   (1x128 acts/grads, 128x128 weights)
    fp8_tensorwise -> Float8CurrentScaling(fp8_format=HYBRID) (E4M3 forward, E5M2 gradients)
    nvfp4          -> NVFP4BlockScaling(disable_rht=rht == none, disable_stochastic_rounding=sr == none,
                                        disable_2d_quantization=weight_tile == 1x16)   (sm_100+)
                      + TE's newer fields (nvfp4_recipe_kwargs), passed only where the policy sets them:
                        four_over_six=S               -> nvfp4_4over6=S (none / weights / activations / all)
                        four_over_six_scale_bound=256 -> nvfp4_4over6_e4m3_use_256=S (448: "none")
                        four_over_six_err_mode=mae    -> nvfp4_4over6_err_mode="MAE" (mse: "MSE")
                        row_scaled_activation=true    -> row_scaled_activation=True
                        backward_override=B           -> backward_override=B (high_precision / dequantized)

TE cannot express: RHT or SR outside its fixed placement (rht: all, sr: all), an RHT size other
than 16, MXFP4 training, blockwise FP8 with non-power-of-two scales, a forward-only /
backward-only mid-run switch, forward_override, our four_over_six=activations_fprop / all_fprop
(4over6 on the activations' Fprop copy beside an RHT'd Wgrad copy: TE refuses 4over6 with the RHT),
row-scaled activations with a quantized backward (TE needs backward_override with them), and, on a
TE whose NVFP4BlockScaling lacks a field above, that option; those policies are refused here (auto
falls back to emulated). The newer fields' mapping is checked on CPU against the field names; it has
not run on a Blackwell GPU.
BF16 blocks, and every block after a full switch, run outside `te.autocast`.

TE's FP8 GEMMs need both weight dims to be multiples of 16 and the token count a multiple of 8
(`assert_dim_for_fp8_exec`); a Mamba in_proj (3604 outputs in hybrid_125m) is not. TELinear
therefore owns the FP32 weight in its logical shape, as QuantLinear does, and hands TE zero-padded
copies of the weight and input where a dim needs it: zero rows and columns change no block's amax,
so the quantized values of the real entries are what they would be unpadded (the emulated path
pads the same way), and the padded outputs are cropped.

Tested on a GPU by tests/precision/test_te.py; scripts/te_on_gpu.sh brings TE 2.20 to a GPU machine
without network and builds it there (docs/results/te.md).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import hardware
from ..layer import PrecisionLinear
from ..recipe import PrecisionPolicy
from .base import Backend

TE_DIM_MULTIPLE = 16  # TE's FP8 GEMMs: K and N multiples of 16, tokens of 8 (16 here: one rule)


def unsupported(policy: PrecisionPolicy) -> str | None:
    """Why TE cannot run `policy` on this machine (None: it can). The machine is read through
    `hardware` at call time, so a test can fake a GPU by patching `hardware`'s two queries."""
    if not hardware.te_installed():
        return "transformer_engine is not installed"
    cap = hardware.cuda_capability()
    if cap is None:
        return "TE needs a CUDA GPU"
    fmt = policy.format
    if fmt == "mxfp4":
        return "TE has no MXFP4 training recipe"
    if policy.switch.at_fraction is not None and policy.switch.mode != "full":
        return f"TE cannot switch only one pass to BF16 (switch.mode={policy.switch.mode!r})"
    if policy.forward_override != "none":
        return f"TE has no forward-only BF16 (forward_override={policy.forward_override.value!r})"
    if policy.backward_override != "none" and fmt != "nvfp4":
        return f"backward_override={policy.backward_override.value!r} is mapped onto TE's NVFP4 recipe only"
    if fmt.startswith("fp8"):
        if cap < (8, 9):
            return f"TE FP8 needs sm_89+; this GPU is sm_{cap[0]}{cap[1]}"
        if fmt == "fp8_blockwise":
            if cap[0] != 9:
                return f"Float8BlockScaling runs natively on Hopper (sm_90) only; this GPU is sm_{cap[0]}{cap[1]}"
            if not policy.fp8_pow2_scales:
                return "TE's Float8BlockScaling uses power-of-two scales (fp8_pow2_scales: false is emulated only)"
            if policy.resolved_weight_tile != "128x128":
                return "TE's Float8BlockScaling uses 128x128 weight tiles"
        return None
    if fmt == "nvfp4":
        if cap < (10, 0):
            return (
                f"TE's NVFP4 recipe (NVFP4BlockScaling) needs a Blackwell GPU (sm_100+); "
                f"this GPU is sm_{cap[0]}{cap[1]}"
            )
        if policy.rht == "all" or policy.sr == "all":
            return "TE applies RHT to Wgrad inputs only and SR to gradients only (rht/sr: all is emulated only)"
        if policy.rht != "none" and policy.resolved_rht_dim != 16:
            return "TE's RHT is 16x16"
        fos = policy.four_over_six.value
        if fos in ("activations_fprop", "all_fprop"):
            return (
                f"four_over_six={fos!r} is ours, not TE's (4over6 on the activations' Fprop copy beside their "
                "RHT'd Wgrad copy: TE refuses 4over6 with the RHT)"
            )
        if policy.row_scaled_activation and policy.backward_override == "none":
            return (
                "TE's row-scaled activations have no quantized backward: it needs "
                "precision.backward_override=high_precision or dequantized"
            )
        missing = sorted(set(nvfp4_recipe_kwargs(policy)) - hardware.te_nvfp4_recipe_fields())
        if missing:
            return (
                f"this Transformer Engine's NVFP4BlockScaling has no {', '.join(missing)} (TE 2.17 or newer has them)"
            )
        return None
    return f"format {fmt!r} has no TE recipe"


class TEBackend(Backend):
    name, native_gemm = "te", True

    def unsupported(self, policy):
        return unsupported(policy)


def nvfp4_recipe_kwargs(policy: PrecisionPolicy) -> dict[str, bool | str]:
    """NVFP4BlockScaling's arguments for an nvfp4 `policy` (the mapping in the module docstring). TE's newer
    fields appear only where the policy sets them, so the paper's recipe needs no newer TE."""
    kwargs: dict[str, bool | str] = {
        "disable_rht": policy.rht == "none",
        "disable_stochastic_rounding": policy.sr == "none",
        "disable_2d_quantization": policy.resolved_weight_tile == "1x16",
    }
    fos = policy.four_over_six.value
    if fos != "none":
        kwargs["nvfp4_4over6"] = fos
        kwargs["nvfp4_4over6_e4m3_use_256"] = fos if policy.four_over_six_scale_bound == 256 else "none"
        kwargs["nvfp4_4over6_err_mode"] = policy.four_over_six_err_mode.value.upper()
    if policy.row_scaled_activation:
        kwargs["row_scaled_activation"] = True
    if policy.backward_override != "none":
        kwargs["backward_override"] = policy.backward_override.value
    return kwargs


def make_recipe(policy: PrecisionPolicy):
    from transformer_engine.common import recipe as te_recipe

    if policy.format == "fp8_blockwise":
        return te_recipe.Float8BlockScaling(fp8_format=te_recipe.Format.E4M3)
    if policy.format == "fp8_tensorwise":
        return te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID)
    if policy.format == "nvfp4":
        return te_recipe.NVFP4BlockScaling(**nvfp4_recipe_kwargs(policy))
    raise ValueError(f"format {policy.format!r} has no TE recipe")


class TELinear(PrecisionLinear):
    """y = x @ weight.T through a te.Linear (no bias), under `te.autocast(recipe)` unless it is a
    BF16 block or the schedule has switched.

    `.weight` is the FP32 [out, in] parameter every `PrecisionLinear` has (on the CPU unless `device` says
    otherwise). The te.Linear is kept out of the module tree (no state-dict entry: the recipes used here
    are stateless, TE's `_extra_state` is empty for them); it lives on the GPU and gets the weight,
    zero-padded to multiples of 16 where needed, at each call. Its `sr_seeds` and `rht_signs` buffers are
    every precision linear's (the same state dict on every backend): TE draws its SR bits from torch's
    default CUDA generator, so the seeds are recorded, not drawn from; TE's fixed 16-point signs are
    hadamard's default vector, the one `rht_signs` holds (other RHT sizes are refused, `unsupported`)."""

    backend_name = "te"

    def __init__(self, in_features: int, out_features: int, **common):
        super().__init__(in_features, out_features, **common)
        import transformer_engine.pytorch as te

        policy, device = common["policy"], common.get("device")
        self.padded_in = -(-in_features // TE_DIM_MULTIPLE) * TE_DIM_MULTIPLE
        self.padded_out = -(-out_features // TE_DIM_MULTIPLE) * TE_DIM_MULTIPLE
        te_linear = te.Linear(
            self.padded_in,
            self.padded_out,
            bias=False,
            params_dtype=torch.float32,
            device="cuda" if device is None or torch.device(device).type != "cuda" else device,
        )
        del te_linear.weight  # TE reads `weight` by attribute at each call: forward() sets it
        object.__setattr__(self, "te_linear", te_linear)  # not a submodule: see the class docstring
        # a BF16 layer of a quantized run (a BF16 block, or precision.modules naming bf16) runs outside te.autocast
        self.bf16_block = policy.format == "bf16" or policy.is_bf16_block(self.block_index, self.n_blocks)
        self.te_recipe = None if policy.format == "bf16" else make_recipe(policy)
        self.stats_enabled = False

    def set_switched(self, switched: bool) -> None:
        self.switched = bool(switched)

    @property
    def quantized(self) -> bool:
        return not (self.bf16_block or self.switched)

    def generator_state(self) -> dict:
        return {}  # TE draws SR bits from torch's default CUDA generator

    def load_generator_state(self, state) -> None:
        pass

    def pop_stats(self) -> dict[str, float]:
        return {}  # TE keeps its quantized tensors internal; telemetry is an emulated-backend feature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import transformer_engine.pytorch as te

        # TE's FP8 GEMMs want the token count a multiple of 8 and K, N multiples of 16: zero-pad what
        # is not (zeros change no amax), crop the output.
        leading, tokens = x.shape[:-1], x.numel() // self.in_features
        x = x.reshape(tokens, self.in_features)
        pad_tokens, pad_in = -tokens % TE_DIM_MULTIPLE, self.padded_in - self.in_features
        pad_out = self.padded_out - self.out_features
        if pad_tokens or pad_in:
            x = nn.functional.pad(x, (0, pad_in, 0, pad_tokens))
        weight = self.weight.view_as(self.weight)  # a plain tensor: a Parameter would be registered in te_linear
        if pad_out or pad_in:
            weight = nn.functional.pad(weight, (0, pad_in, 0, pad_out))
        self.te_linear.weight = weight
        self.te_linear.train(self.training)
        if hasattr(te, "autocast"):  # TE >= 2.9
            context = te.autocast(enabled=self.quantized, recipe=self.te_recipe)
        else:
            context = te.fp8_autocast(enabled=self.quantized, fp8_recipe=self.te_recipe)
        try:
            with context:
                y = self.te_linear(x)
        finally:
            self.te_linear.weight = None  # hold no reference to this step's (padded) weight
        if pad_tokens or pad_out:
            y = y[:tokens, : self.out_features]
        return y.reshape(*leading, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"{self.in_features}, {self.out_features}, {self.label}, te "
            f"{type(self.te_recipe).__name__ if self.te_recipe is not None else 'bf16'}"
            f"{' (bf16 block)' if self.bf16_block else ''}"
        )
