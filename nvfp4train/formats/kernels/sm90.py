"""Our Triton kernels compiled for an H100 (sm_90a) on any machine, no GPU needed: the compile helper the PTX
checks (tests/formats/test_triton.py) use, and SASS instructions per element of each kernel variant.

    python -m nvfp4train.formats.kernels.sm90                      # every kernel variant below
    python -m nvfp4train.formats.kernels.sm90 --kernels rht_rowwise_rne dequantize_nvfp4

The quantizers are bound by instruction issue, not memory (Nsight Compute), so the machine code a kernel runs
per element is a fair proxy for its speed where no GPU is at hand: fewer instructions per element have come with
faster kernels and steps. The proxy holds only while the memory access pattern stays: a cut that loaded each
16-element block as two strided halves had fewer instructions still and a slower kernel, waiting on memory (the
numbers: docs/results/code-measurements.md). Time a cut on a GPU before keeping it. Each
variant is compiled as the launcher runs it (its block shape, warps and constexprs; pointers 16-byte aligned
and sizes divisible by 16, as Triton's JIT specializes them at run time), disassembled with the nvdisasm
Triton ships, and its static instruction count divided by the elements a thread handles (the kernels are
straight-line code: Triton unrolls their static loops). To compare two commits, run it in a worktree of each
(`git worktree add /tmp/old <rev>`, then `cd /tmp/old && python -m nvfp4train.formats.kernels.sm90`).
Needs triton with its NVIDIA backend (the CPU wheel has it); prints a table.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton

from . import common, dequant, fp8, nvfp4, rht, rounding

# The non-constexpr arguments of the kernels, by family (pointer element types as a bf16 training step
# launches them).
IO_ARGS = {
    "x_ptr": "*bf16",
    "bits_ptr": "*i32",
    "seed_ptr": "*i64",
    "codes_ptr": "*u8",
    "scales_ptr": "*u8",
    "values_ptr": "*bf16",
}
NVFP4_ARGS = {**IO_ARGS, "global_ptr": "*fp32", "rows": "i32", "cols": "i32"}
RHT_ARGS = {
    **IO_ARGS,
    "global_ptr": "*fp32",
    "n_tokens": "i32",
    "n_features": "i32",
    "row_global_ptr": "*fp32",
    "row_seed_ptr": "*i64",
    "row_codes_ptr": "*u8",
    "row_scales_ptr": "*u8",
    "row_values_ptr": "*bf16",
}
DEQUANTIZE_ARGS = {
    "codes_ptr": "*u8",
    "scales_ptr": "*u8",
    "global_ptr": "*fp32",
    "values_ptr": "*bf16",
    "rows": "i32",
    "cols": "i32",
}
NVFP4_TE_ARGS = {
    "x_ptr": "*bf16",
    "amax_ptr": "*fp32",
    "s_dec_ptr": "*fp32",
    "codes_ptr": "*u8",
    "scales_ptr": "*u8",
    "values_ptr": "*bf16",
    "rows": "i32",
    "cols": "i32",
    "six_bound": "fp32",
    "inv_six_bound": "fp32",
}
# nvfp4._nvfp4_4over6_rowcol_kernel as training launches it: an FP32 master weight, dense bf16 W and Wᵀ
NVFP4_4OVER6_ROWCOL_ARGS = {
    "x_ptr": "*fp32",
    "amax_ptr": "*fp32",
    "s_dec_ptr": "*fp32",
    "codes_ptr": "*fp32",
    "scales_ptr": "*fp32",
    "values_ptr": "*bf16",
    "codes_t_ptr": "*fp32",
    "scales_t_ptr": "*fp32",
    "values_t_ptr": "*bf16",
    "rows": "i32",
    "cols": "i32",
    "col_width": "i32",
    "six_bound": "fp32",
    "inv_six_bound": "fp32",
}
RHT_AMAX_ARGS = {"x_ptr": "*bf16", "partial_ptr": "*i32", "row_partial_ptr": "*i32", "n_features": "i32"}
SCALE_CAST_ARGS = {"x_ptr": "*fp32", "a_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": "*bf16", "n": "i32"}
FP8_TENSORWISE_ROWCOL_ARGS = {
    "x_ptr": "*bf16",
    "a_ptr": "*bf16",
    "amax_ptr": "*fp32",
    "data_ptr": "*u8",
    "data_t_ptr": "*u8",
    "decode_ptr": "*fp32",
    "rows": "i32",
    "cols": "i32",
}
FP8_BLOCKWISE_ROWCOL_ARGS = {
    "x_ptr": "*bf16",
    "a_ptr": "*bf16",
    "row_data_ptr": "*u8",
    "row_scales_ptr": "*fp32",
    "col_data_ptr": "*u8",
    "col_scales_ptr": "*fp32",
    "n_tokens": "i32",
    "n_features": "i32",
    "row_width": "i32",
    "scale_for_inf": "fp32",
}
FP8_TILES_ROWCOL_ARGS = {
    "x_ptr": "*fp32",
    "data_ptr": "*u8",
    "scales_ptr": "*fp32",
    "data_t_ptr": "*u8",
    "scales_t_ptr": "*fp32",
    "rows": "i32",
    "cols": "i32",
    "padded_rows": "i32",
    "row_width": "i32",
    "col_width": "i32",
    "scale_for_inf": "fp32",
}
RHT_BLOCKS = {"SIGN_MASK": 0xB7E8, "GROUPS": rht.RHT_GROUPS, "BLOCK_F": rht.RHT_BLOCK_F}


def compile_sm90(kernel, signature: dict[str, str], constexprs: dict, num_warps: int = 4, aligned: bool = False):
    """``kernel`` compiled for sm_90 (as the launchers run it: no FP fusion) with ``signature`` (its
    non-constexpr arguments' types) and ``constexprs`` (those left out take the kernel's defaults).
    ``aligned``: specialize pointers as 16-byte aligned and i32 sizes as divisible by 16, as Triton's JIT
    does at run time for our launches (not the arguments the kernel marks ``do_not_specialize``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    constexprs = {**{k: v for k, v in defaults.items() if k not in signature}, **constexprs}
    full = {**{name: "constexpr" for name in constexprs}, **signature}
    full = {name: full[name] for name in kernel.arg_names}
    attrs = {}
    if aligned:
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, name in enumerate(kernel.arg_names)
            if (full[name].startswith("*") or full[name] == "i32") and not kernel.params[i].do_not_specialize
        }
    return triton_compile(
        ASTSource(fn=kernel, signature=full, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"enable_fp_fusion": False, "num_warps": num_warps},
    )


@dataclass
class Variant:
    kernel: object
    signature: dict[str, str]  # the non-constexpr arguments
    constexprs: dict[str, object]
    elements: int  # input elements one program handles
    warps: int = 4


_HW_BF16 = {"HW_BF16": True}  # as the launchers set it on an H100 (common.hw_bf16)
_RHT_TILE = rht.RHT_GROUPS * 16 * rht.RHT_BLOCK_F
_RHT_WARPS = rht.program_blocks(1 << 20, 16)[2]


def _rht(mode: int, dense: bool, rowwise: bool, row_dense: bool | None = None) -> Variant:
    return Variant(
        rht._rht_nvfp4_kernel,
        RHT_ARGS,
        {
            **RHT_BLOCKS,
            **_HW_BF16,
            "ROUNDING": mode,
            "DENSE": dense,
            "ROWWISE": rowwise,
            "ROW_DENSE": rowwise if row_dense is None else row_dense,
        },
        _RHT_TILE,
        _RHT_WARPS,
    )


def _te(tile_rows: int, mode: int, row_scaled: bool = False) -> Variant:
    return Variant(
        nvfp4._nvfp4_te_kernel,
        NVFP4_TE_ARGS,
        {
            "MODE": mode,
            "ROW_SCALED": row_scaled,
            "TILE_ROWS": tile_rows,
            "DENSE": True,
            "CHUNK": 8,
            "BLOCK_R": common.BLOCK_ROWS,
            "BLOCK_C": common.BLOCK_COLS,
        },
        common.BLOCK_ROWS * common.BLOCK_COLS,
    )


# What a bf16 training step launches (operands.py / linear.py), by name.
VARIANTS = {
    # NVFP4 1x16 along features (Fprop / Dgrad operands on their own), RNE and Philox SR, dense bf16 out
    "nvfp4_rne": Variant(
        nvfp4._nvfp4_kernel,
        NVFP4_ARGS,
        {
            "TILE_ROWS": 1,
            "ROUNDING": rounding.RNE,
            "DENSE": True,
            "BLOCK_R": common.BLOCK_ROWS,
            "BLOCK_C": common.BLOCK_COLS,
        },
        common.BLOCK_ROWS * common.BLOCK_COLS,
    ),
    "nvfp4_sr": Variant(
        nvfp4._nvfp4_kernel,
        NVFP4_ARGS,
        {
            "TILE_ROWS": 1,
            "ROUNDING": rounding.SR_PHILOX,
            "DENSE": True,
            "BLOCK_R": common.BLOCK_ROWS,
            "BLOCK_C": common.BLOCK_COLS,
        },
        common.BLOCK_ROWS * common.BLOCK_COLS,
    ),
    # TE's newer options (_nvfp4_te_kernel, one variant per error mode for every bound / scaling): the 4over6
    # weights (16x16, dense: Fprop's W), a 4over6 activation (1x16, dense: Fprop's X), MAE (TE's default) or MSE;
    # a row-scaled activation without 4over6 (MODE 0)
    "nvfp4_te_16x16": _te(16, mode=1),
    "nvfp4_te_1x16": _te(1, mode=1),
    "nvfp4_te_16x16_mse": _te(16, mode=2),
    "nvfp4_te_1x16_mse": _te(1, mode=2),
    "nvfp4_te_1x16_rowscaled": _te(1, mode=1, row_scaled=True),
    "nvfp4_rowscaled_1x16": _te(1, mode=0, row_scaled=True),
    # a 4over6 weight's W (Fprop) and Wᵀ (Dgrad) from one read (nvfp4.quantize_tiles_rowcol; the weight cache)
    "nvfp4_4over6_rowcol": Variant(
        nvfp4._nvfp4_4over6_rowcol_kernel,
        NVFP4_4OVER6_ROWCOL_ARGS,
        {"MODE": 1, "DENSE": True, "CHUNK": 4, "BLOCK_C": common.BLOCK_COLS},
        common.BLOCK_ROWS * common.BLOCK_COLS,
    ),
    "nvfp4_4over6_rowcol_mse": Variant(
        nvfp4._nvfp4_4over6_rowcol_kernel,
        NVFP4_4OVER6_ROWCOL_ARGS,
        {"MODE": 2, "DENSE": True, "CHUNK": 4, "BLOCK_C": common.BLOCK_COLS},
        common.BLOCK_ROWS * common.BLOCK_COLS,
    ),
    # the 16-point RHT along tokens, transposed (Wgrad operands); "rowwise": with the 1x16 copy of the same tile
    "rht_amax_rowwise": Variant(
        rht._rht_abs_max_kernel,
        RHT_AMAX_ARGS,
        {**RHT_BLOCKS, "ROWWISE": True},
        _RHT_TILE,
        _RHT_WARPS,
    ),
    "rht_rne_packed": _rht(rounding.RNE, dense=False, rowwise=False),
    "rht_rowwise_rne": _rht(rounding.RNE, dense=True, rowwise=True),
    "rht_rowwise_sr": _rht(
        rounding.SR_PHILOX, dense=True, rowwise=True
    ),  # dY: Dgrad's and Wgrad's operands, both dense
    "rht_packed_rowwise_rne": _rht(
        rounding.RNE, dense=False, rowwise=True, row_dense=True
    ),  # X: Fprop's dense, Wgrad's packed
    "dequantize_nvfp4": Variant(
        dequant._e2m1_dequantize_kernel,
        DEQUANTIZE_ARGS,
        {"GROUP": 16, "E8M0": False, "HAS_GLOBAL": False, "BLOCK_R": 8, "BLOCK_C": 256},
        8 * 256,
    ),
    "dequantize_mxfp4": Variant(
        dequant._e2m1_dequantize_kernel,
        DEQUANTIZE_ARGS,
        {"GROUP": 32, "E8M0": True, "HAS_GLOBAL": False, "BLOCK_R": 8, "BLOCK_C": 256},
        8 * 256,
    ),
    "scale_and_cast": Variant(
        dequant._scale_and_cast_kernel,
        SCALE_CAST_ARGS,
        {"HAS_A": True, "HAS_B": True, "BLOCK": dequant.SCALE_CAST_BLOCK},
        dequant.SCALE_CAST_BLOCK,
    ),
    "fp8_tensorwise_rowcol": Variant(
        fp8._fp8_tensorwise_rowcol_kernel,
        FP8_TENSORWISE_ROWCOL_ARGS,
        {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": False, "HW_CVT": True, "BLOCK": fp8.TENSORWISE_TILE},
        fp8.TENSORWISE_TILE**2,
        fp8.TENSORWISE_WARPS,
    ),
    "fp8_blockwise_rowcol": Variant(
        fp8._fp8_blockwise_rowcol_kernel,
        FP8_BLOCKWISE_ROWCOL_ARGS,
        {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": True, "HW_CVT": True, "RAGGED": False},
        128 * 128,
        fp8.BLOCKWISE_ROWCOL_WARPS,
    ),
    # the FP32 master weight: its 128x128 tiles for Fprop and the same transposed for Dgrad, once per step
    "fp8_tiles_rowcol": Variant(
        fp8._fp8_tiles_rowcol_kernel,
        FP8_TILES_ROWCOL_ARGS,
        {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": True, "HW_CVT": True},
        128 * 128,
        8,
    ),
}


def sass_opcodes(variant: Variant) -> collections.Counter:
    """Opcode -> count in the kernel's sm_90a machine code."""
    compiled = compile_sm90(variant.kernel, variant.signature, variant.constexprs, variant.warps, aligned=True)
    nvdisasm = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():  # "/*0040*/  @!P0 FFMA.FTZ R1, R2, R3, R4 ;" -> FFMA
        match = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if match:
            ops[match.group(1)] += 1
    return ops


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    rows = []
    print(f"{'kernel':<24} {'warps':>5} {'elem/thread':>11} {'SASS':>6} {'per elem':>9}  top opcodes")
    for name in args.kernels:
        variant = VARIANTS[name]
        ops = sass_opcodes(variant)
        per_thread = variant.elements // (32 * variant.warps)
        total = sum(ops.values())
        rows.append({"kernel": name, "sass": total, "per_element": total / per_thread})
        top = " ".join(f"{op} {n}" for op, n in ops.most_common(6))
        print(
            f"{name:<24} {variant.warps:>5} {per_thread:>11} {total:>6} {total / per_thread:>9.1f}  {top}", flush=True
        )
    return rows


if __name__ == "__main__":
    main()
