"""Transformer Engine backend: the same policy as TE modules and recipes.

`transformer_engine` itself is imported only when a TE layer is built: nothing else in the
package depends on it (`backends.TE` is this module's backend object). Mapping onto TE's recipes
(https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/api/common.html):

    fp8_blockwise  -> Float8BlockScaling(fp8_format=E4M3)   (1x128 acts/grads, 128x128 weights)
    fp8_tensorwise -> Float8CurrentScaling(fp8_format=HYBRID) (E4M3 forward, E5M2 gradients)
    nvfp4          -> NVFP4BlockScaling(disable_rht=rht == none, disable_stochastic_rounding=sr == none,
                                        disable_2d_quantization=weight_tile == 1x16)   (sm_100+)

TE cannot express: RHT or SR outside its fixed placement (rht: all, sr: all), an RHT size other
than 16, MXFP4 training, blockwise FP8 with non-power-of-two scales, or a forward-only /
backward-only mid-run switch; those policies are refused here (auto falls back to emulated).
BF16 blocks, and every block after a full switch, run outside `te.autocast`.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .hardware import cuda_capability, te_installed
from .policy import PrecisionPolicy


def unsupported(policy: PrecisionPolicy) -> str | None:
    if not te_installed():
        return "transformer_engine is not installed"
    cap = cuda_capability()
    if cap is None:
        return "TE needs a CUDA GPU"
    fmt = policy.format
    if fmt == "mxfp4":
        return "TE has no MXFP4 training recipe"
    if policy.switch.at_fraction is not None and policy.switch.mode != "full":
        return f"TE cannot switch only one pass to BF16 (switch.mode={policy.switch.mode!r})"
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
            return f"TE NVFP4BlockScaling needs sm_100+; this GPU is sm_{cap[0]}{cap[1]}"
        if policy.rht == "all" or policy.sr == "all":
            return "TE applies RHT to Wgrad inputs only and SR to gradients only (rht/sr: all is emulated only)"
        if policy.rht != "none" and policy.resolved_rht_dim != 16:
            return "TE's RHT is 16x16"
        return None
    return f"format {fmt!r} has no TE recipe"


def make_recipe(policy: PrecisionPolicy):
    from transformer_engine.common import recipe as te_recipe

    if policy.format == "fp8_blockwise":
        return te_recipe.Float8BlockScaling(fp8_format=te_recipe.Format.E4M3)
    if policy.format == "fp8_tensorwise":
        return te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID)
    if policy.format == "nvfp4":
        return te_recipe.NVFP4BlockScaling(
            disable_rht=policy.rht == "none",
            disable_stochastic_rounding=policy.sr == "none",
            disable_2d_quantization=policy.resolved_weight_tile == "1x16",
        )
    raise ValueError(f"format {policy.format!r} has no TE recipe")


class TELinear(nn.Module):
    """A te.Linear (no bias, FP32 params) run under `te.autocast(recipe)` unless it is a BF16 block
    or the schedule has switched. `.weight` is the TE module's parameter."""

    def __init__(self, in_features: int, out_features: int, *, policy: PrecisionPolicy, block_index: int,
                 n_blocks: int, name: str, seed: int = 0, device=None):
        super().__init__()
        import transformer_engine.pytorch as te

        self.in_features, self.out_features = in_features, out_features
        self.block_index, self.n_blocks, self.name = block_index, n_blocks, name
        self.label = f"block{block_index}.{name}"
        self.backend_name = "te"
        self.linear = te.Linear(in_features, out_features, bias=False, params_dtype=torch.float32,
                                device=device if device is not None else "cuda")
        self.te_recipe = make_recipe(policy)
        self.bf16_block = policy.is_bf16_block(block_index, n_blocks)
        self.switched = False
        self.stats_enabled = False
        nn.init.kaiming_uniform_(self.linear.weight, a=math.sqrt(5))

    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    def set_switched(self, switched: bool) -> None:
        self.switched = bool(switched)

    def generator_state(self) -> dict:
        return {}  # TE draws SR bits from torch's default CUDA generator

    def load_generator_state(self, state) -> None:
        pass

    def pop_stats(self) -> dict[str, float]:
        return {}  # TE keeps its quantized tensors internal; telemetry is an emulated-backend feature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import transformer_engine.pytorch as te

        quantized = not (self.bf16_block or self.switched)
        if hasattr(te, "autocast"):  # TE >= 2.9
            context = te.autocast(enabled=quantized, recipe=self.te_recipe)
        else:
            context = te.fp8_autocast(enabled=quantized, fp8_recipe=self.te_recipe)
        with context:
            return self.linear(x)
