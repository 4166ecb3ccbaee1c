"""`python -m nvfp4train.export ... weights=nvfp4_packed`: the NVFP4 weights a run trained with, packed in the
`compressed-tensors` format `nvfp4-pack-quantized` that vLLM serves (and transformers loads with compressed-tensors).

Each linear of a block the recipe ran in NVFP4 is stored as the run's own Fprop weight operand (the same
`precision.operands.pack` of the FP32 master weight as training, so 16x16 or 1x16 tiles as the recipe says):

    <module>.weight_packed        uint8 [out, in/2]   two E2M1 codes a byte, element 2j in the low nibble
    <module>.weight_scale         float8_e4m3fn [out, in/16]   one decode scale per 16 inputs (a 16x16 tile's
                                  scale stands on each of its 16 rows: the same numbers as 1x16 blocks)
    <module>.weight_global_scale  float32 [1]   the ENCODE scale s_enc = 2688 / amax (compressed-tensors divides
                                  the block scale by it; vLLM takes 1 / it, which is our s_dec bit for bit)

Attention's fused qkv was quantized as one tensor: q_proj / k_proj / v_proj get its rows and the same global
scale (vLLM fuses them again and takes the max of the three, i.e. that scale). The linears of the recipe's BF16
blocks, the embedding, the head, the norms and the Mamba conv / A / D / dt are written densely, as `dtype` says,
and listed in `quantization_config.ignore` (linears only; the rest is no Linear). Weight-only (W4A16): the
activations were quantized with a per-tensor scale computed at each step, which a static `input_global_scale`
cannot restate; vLLM runs the GEMMs with BF16 activations.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from nvfp4train.eval.weights import RunError
from nvfp4train.formats import nvfp4

WEIGHTS_CHOICES = ("dense", "nvfp4_packed")
PACKED_FORMAT = "nvfp4-pack-quantized"
SERVE_INSTALL = "pip install 'nvfp4train[serve]'"
PACKED_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale")
LINEAR_WEIGHT = re.compile(r"blocks\.(\d+)\.mixer\.(in_proj|out_proj|qkv|out|fc1|fc2)\.weight")


def require_compressed_tensors():
    try:
        import compressed_tensors
    except ImportError:
        raise RunError(f"weights=nvfp4_packed needs the compressed-tensors library: {SERVE_INSTALL}") from None
    return compressed_tensors


def _policy(run_dir: Path, run_config: dict, meta: dict):
    """The run's precision policy, refused in one line where its weights have no packed NVFP4 form."""
    from nvfp4train.config.schema import ConfigError
    from nvfp4train.precision import PrecisionPolicy
    from nvfp4train.precision.recipe import recorded_precision

    where = f"weights=nvfp4_packed: {Path(run_dir) / 'config.yaml'}"
    try:
        policy = PrecisionPolicy.from_dict(recorded_precision(run_config.get("precision") or {}))
    except ConfigError as e:
        raise RunError(f"{where}: {e}") from None
    if policy.format != "nvfp4":
        raise RunError(
            f"{where}: precision.format={str(policy.format)!r}: only a run trained in NVFP4 (precision.format=nvfp4) "
            "has NVFP4 weights to pack; export this one with weights=dense"
        )
    if policy.rht == "all":
        raise RunError(
            f"{where}: precision.rht='all': the weights were quantized after a Hadamard rotation of their inputs, "
            "which nvfp4-pack-quantized cannot describe; export with weights=dense"
        )
    if policy.sr == "all":
        raise RunError(
            f"{where}: precision.sr='all': the weights were stochastically rounded afresh at every use, so there is "
            "no one quantized weight to pack; export with weights=dense"
        )
    max_steps = int((run_config.get("train") or {}).get("max_steps") or 0)
    if policy.switch.mode != "backward_only" and max_steps and policy.switch_due(meta["step"] / max_steps):
        raise RunError(
            f"{where}: precision.switch: the forward switched to BF16 at {policy.switch.at_fraction:g} of the tokens, "
            f"before this checkpoint (step {meta['step']}); export with weights=dense (or an earlier step=N)"
        )
    return policy


def pack_linears(model, run_dir: Path, run_config: dict, meta: dict) -> tuple[dict[str, nvfp4.NVFP4Tensor], list]:
    """({our weight name: its packed Fprop operand} for the NVFP4 linears, [our weight names kept dense])."""
    from nvfp4train.precision import operands

    policy = _policy(run_dir, run_config, meta)
    n_blocks = len(run_config["model"]["pattern"])
    packed, kept = {}, []
    for name, weight in model.state_dict().items():
        match = LINEAR_WEIGHT.fullmatch(name)
        if not match:
            continue
        # the linear's own policy: precision.modules may give it another preset than the run's
        spec = policy.for_module(name.removesuffix(".weight")).layer_recipe(int(match.group(1)), n_blocks).fprop_w
        # BF16, or what precision.modules chose for it without one packable weight (another format, a rotated or
        # stochastically rounded weight operand; for the run's own policy `_policy` refused those): kept dense
        if spec.format != "nvfp4" or spec.rht_dim or spec.rounding == "sr":
            kept.append(name)
            continue
        rows, cols = weight.shape
        if cols % nvfp4.BLOCK:
            raise RunError(
                f"weights=nvfp4_packed: {name} has {cols} inputs, not a multiple of the NVFP4 block of "
                f"{nvfp4.BLOCK} (training padded them; nvfp4-pack-quantized cannot); export with weights=dense"
            )
        with torch.no_grad():
            codes, scales, amax, s_dec = operands.pack(weight.detach().float().cpu(), spec, cols).tensors
        packed[name] = nvfp4.NVFP4Tensor(
            codes[:rows].contiguous(), scales[:rows].contiguous(), amax, s_dec, torch.Size((rows, cols)), spec.tile
        )
    if not packed:
        raise RunError(
            f"weights=nvfp4_packed: {Path(run_dir) / 'config.yaml'}: precision.bf16_first/bf16_last keep every block "
            "in BF16: no linear was trained in NVFP4; export with weights=dense"
        )
    return packed, kept


def packed_state(packed: dict[str, nvfp4.NVFP4Tensor], model_config: dict) -> dict[str, torch.Tensor]:
    """The compressed tensors under Nemotron-H's names (fused qkv split by rows, as the dense export does)."""
    from nvfp4train.export import to_hf_state

    out = {}
    for name, q in packed.items():
        encode = nvfp4.global_encode_scale(q.amax).reshape(1)
        codes = to_hf_state({name: q.codes}, model_config)
        scales = to_hf_state({name: q.scales}, model_config)
        for hf_name in codes:
            module = hf_name.removesuffix(".weight")
            out[f"{module}.weight_packed"] = codes[hf_name]
            out[f"{module}.weight_scale"] = scales[hf_name]
            out[f"{module}.weight_global_scale"] = encode.clone()
    return out


def quantization_config(ignore: list[str]) -> dict:
    """config.json's `quantization_config`, built by compressed-tensors itself (its NVFP4A16 preset) and laid out
    as its ModelCompressor writes it."""
    compressed_tensors = require_compressed_tensors()
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    scheme.format = PACKED_FORMAT
    config = QuantizationConfig(
        config_groups={"group_0": scheme}, format=PACKED_FORMAT, quantization_status="compressed", ignore=ignore
    )
    return {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **config.model_dump(mode="json", exclude={"quant_method"}),
    }


def ignored_modules(kept: list[str]) -> list[str]:
    """The Linear modules compressed-tensors must leave alone: the head and the BF16 blocks' linears, under
    Nemotron-H's names (qkv is three)."""
    from nvfp4train.export import MIXER_RENAMES

    names = ["lm_head"]
    for name in kept:
        _, index, _, linear, _ = name.split(".")
        prefix = f"model.layers.{index}.mixer."
        if linear == "qkv":
            names += [prefix + p for p in ("q_proj", "k_proj", "v_proj")]
        else:
            names.append(prefix + MIXER_RENAMES.get(f"{linear}.weight", linear).removesuffix(".weight"))
    return names


def dense_from_packed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A packed export's tensors with each NVFP4 linear dequantized in FP32 (e2m1 x block scale x 1/s_enc, the
    numbers training's GEMMs used), for `load_export`."""
    out = {k: v for k, v in state.items() if not k.endswith(PACKED_SUFFIXES)}
    for key in [k for k in state if k.endswith(".weight_packed")]:
        module = key.removesuffix(".weight_packed")
        codes, scales = state[key], state[f"{module}.weight_scale"]
        encode = state[f"{module}.weight_global_scale"].reshape(())
        shape = torch.Size((codes.shape[0], codes.shape[1] * 2))
        q = nvfp4.NVFP4Tensor(codes, scales, torch.zeros(()), torch.reciprocal(encode), shape, (1, nvfp4.BLOCK))
        out[f"{module}.weight"] = q.dequantize(torch.float32, impl="reference")
    return out
