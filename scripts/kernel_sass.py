"""SASS instructions per element of our Triton quantizer kernels, compiled for an H100 (sm_90a) without a GPU.

    python scripts/kernel_sass.py                      # every kernel variant below
    python scripts/kernel_sass.py --kernels rht_rowwise_rne dequantize_nvfp4

The quantizers are bound by instruction issue, not memory (Nsight Compute on an H100, 2026-11-25: the
RHT + rowwise kernel at 79% SM throughput and 18% of DRAM bandwidth), so the machine code a kernel runs per
element is a fair proxy for its speed where no GPU is at hand: 129 -> 86 instructions per element for that
kernel came with 50.1 -> 33.0 ms a hybrid_1b step on the H100. Each variant is compiled as the launcher
runs it (its block shape, warps and constexprs; pointers 16-byte aligned and sizes divisible by 16, as
Triton's JIT specializes them at run time), disassembled with the nvdisasm Triton ships, and its static
instruction count divided by the elements a thread handles (the kernels are straight-line code: Triton
unrolls their static loops). To compare two commits, run it in a worktree of each
(`git worktree add /tmp/old <rev>`, then `PYTHONPATH=/tmp/old python /tmp/old/scripts/kernel_sass.py`).
Needs triton with its NVIDIA backend (the CPU wheel has it); prints a table.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, compile as triton_compile  # noqa: E402

from nvfp4train.formats import triton_kernels as tk  # noqa: E402


@dataclass
class Variant:
    kernel: object
    signature: dict[str, str]  # the non-constexpr arguments
    constexprs: dict[str, object]
    elements: int  # input elements one program handles
    warps: int = 4


_IO = {"x_ptr": "*bf16", "bits_ptr": "*i32", "seed_ptr": "*i64", "codes_ptr": "*u8", "scales_ptr": "*u8",
       "values_ptr": "*bf16"}
_NVFP4 = {**_IO, "amax_ptr": "*fp32", "s_dec_ptr": "*fp32", "rows": "i32", "cols": "i32"}
_RHT = {**_IO, "amax_ptr": "*fp32", "s_dec_ptr": "*fp32", "n_tokens": "i32", "n_features": "i32",
        "row_amax_ptr": "*fp32", "row_seed_ptr": "*i64", "row_codes_ptr": "*u8", "row_scales_ptr": "*u8",
        "row_values_ptr": "*bf16", "row_s_dec_ptr": "*fp32"}
_RHT_BLOCKS = {"SIGN_MASK": 0xB7E8, "GROUPS": tk.RHT_GROUPS, "BLOCK_F": tk.RHT_BLOCK_F}
_HW_BF16 = {"HW_BF16": True}  # as the launchers set it on an H100 (tk._hw_bf16)
_RHT_TILE = tk.RHT_GROUPS * 16 * tk.RHT_BLOCK_F
_RHT_WARPS = tk.rht_blocks(1 << 20, 16)[2]
_DEQ = {"codes_ptr": "*u8", "scales_ptr": "*u8", "global_ptr": "*fp32", "values_ptr": "*bf16", "rows": "i32",
        "cols": "i32"}


def _rht(rounding: int, dense: bool, rowwise: bool, row_dense: bool | None = None) -> Variant:
    return Variant(tk._rht_nvfp4_kernel, _RHT, {**_RHT_BLOCKS, **_HW_BF16, "ROUNDING": rounding, "DENSE": dense,
                                                "ROWWISE": rowwise,
                                                "ROW_DENSE": rowwise if row_dense is None else row_dense},
                   _RHT_TILE, _RHT_WARPS)


# What a bf16 training step launches (operands.py / linear.py), by name.
VARIANTS = {
    # NVFP4 1x16 along features (Fprop / Dgrad operands on their own), RNE and Philox SR, dense bf16 out
    "nvfp4_rne": Variant(tk._nvfp4_kernel, _NVFP4, {"TILE_ROWS": 1, "ROUNDING": tk.RNE, "DENSE": True,
                                                    "BLOCK_R": tk.BLOCK_ROWS, "BLOCK_C": tk.BLOCK_COLS},
                         tk.BLOCK_ROWS * tk.BLOCK_COLS),
    "nvfp4_sr": Variant(tk._nvfp4_kernel, _NVFP4, {"TILE_ROWS": 1, "ROUNDING": tk.SR_PHILOX, "DENSE": True,
                                                   "BLOCK_R": tk.BLOCK_ROWS, "BLOCK_C": tk.BLOCK_COLS},
                        tk.BLOCK_ROWS * tk.BLOCK_COLS),
    # the 16-point RHT along tokens, transposed (Wgrad operands); "rowwise": with the 1x16 copy of the same tile
    "rht_amax_rowwise": Variant(tk._rht_abs_max_kernel, {"x_ptr": "*bf16", "partial_ptr": "*i32",
                                                         "row_partial_ptr": "*i32", "n_features": "i32"},
                                {**_RHT_BLOCKS, "ROWWISE": True}, _RHT_TILE, _RHT_WARPS),
    "rht_rne_packed": _rht(tk.RNE, dense=False, rowwise=False),
    "rht_rowwise_rne": _rht(tk.RNE, dense=True, rowwise=True),
    "rht_rowwise_sr": _rht(tk.SR_PHILOX, dense=True, rowwise=True),  # dY: Dgrad's and Wgrad's operands, both dense
    "rht_packed_rowwise_rne": _rht(tk.RNE, dense=False, rowwise=True, row_dense=True),  # X: Fprop's dense, Wgrad's packed
    "dequantize_nvfp4": Variant(tk._e2m1_dequantize_kernel, _DEQ, {"GROUP": 16, "E8M0": False, "HAS_GLOBAL": False,
                                                                  "BLOCK_R": 8, "BLOCK_C": 256}, 8 * 256),
    "dequantize_mxfp4": Variant(tk._e2m1_dequantize_kernel, _DEQ, {"GROUP": 32, "E8M0": True, "HAS_GLOBAL": False,
                                                                  "BLOCK_R": 8, "BLOCK_C": 256}, 8 * 256),
    "scale_and_cast": Variant(tk._scale_and_cast_kernel, {"x_ptr": "*fp32", "a_ptr": "*fp32", "b_ptr": "*fp32",
                                                          "y_ptr": "*bf16", "n": "i32"},
                              {"HAS_A": True, "HAS_B": True, "BLOCK": tk.SCALE_CAST_BLOCK}, tk.SCALE_CAST_BLOCK),
    "fp8_tensorwise_rowcol": Variant(tk._fp8_tensorwise_rowcol_kernel,
                                     {"x_ptr": "*bf16", "amax_ptr": "*fp32", "data_ptr": "*u8", "data_t_ptr": "*u8",
                                      "decode_ptr": "*fp32", "rows": "i32", "cols": "i32"},
                                     {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": False, "HW_CVT": True,
                                      "BLOCK": tk.TENSORWISE_TILE}, tk.TENSORWISE_TILE ** 2),
    "fp8_blockwise_rowcol": Variant(tk._fp8_blockwise_rowcol_kernel,
                                    {"x_ptr": "*bf16", "row_data_ptr": "*u8", "row_scales_ptr": "*fp32",
                                     "col_data_ptr": "*u8", "col_scales_ptr": "*fp32", "n_tokens": "i32",
                                     "n_features": "i32", "row_width": "i32", "scale_for_inf": "fp32"},
                                    {"FP8_MAX": 448.0, "MANT": 3, "BIAS": 7, "POW2": True, "HW_CVT": True,
                                     "RAGGED": False},
                                    128 * 128, 8),
}


def sass_opcodes(variant: Variant) -> collections.Counter:
    """Opcode -> count in the kernel's sm_90a machine code."""
    kernel = variant.kernel
    signature = {**{name: "constexpr" for name in variant.constexprs}, **variant.signature}
    signature = {name: signature[name] for name in kernel.arg_names}
    # Triton's JIT specializes 16-byte-aligned pointers and integers divisible by 16: our launches have both.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name].startswith("*") or signature[name] == "i32"}
    compiled = triton_compile(ASTSource(fn=kernel, signature=signature, constexprs=variant.constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"enable_fp_fusion": False, "num_warps": variant.warps})
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
        print(f"{name:<24} {variant.warps:>5} {per_thread:>11} {total:>6} {total / per_thread:>9.1f}  {top}", flush=True)
    return rows


if __name__ == "__main__":
    main()
