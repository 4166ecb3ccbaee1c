"""Triton test kernels around the rounding steps of formats/kernels/ (test_triton.py's Philox,
SR and RNE tests). Imported by those tests only: in the interpreter run (TRITON_INTERPRET=1 set before
triton is imported) or on a GPU."""

from __future__ import annotations

import triton
import triton.language as tl

from nvfp4train.formats import kernels


@triton.jit
def philox_words_kernel(seed_ptr, out_ptr, N: tl.constexpr):
    """out [4, N]: the words r0..r3 of randint4x(seed, counter) for counters 0 .. N - 1."""
    counter = tl.arange(0, N)
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed_ptr), counter)
    tl.store(out_ptr + counter, r0.to(tl.int32, bitcast=True))
    tl.store(out_ptr + N + counter, r1.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 2 * N + counter, r2.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 3 * N + counter, r3.to(tl.int32, bitcast=True))


@triton.jit
def philox_rows_kernel(seed_ptr, out_ptr, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SHIFT: tl.constexpr = 0):
    """out [rows, cols]: _philox_rows' bits (on bits SHIFT .. SHIFT + 7), drawn in BLOCK_R x BLOCK_C tiles."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c0 = tl.program_id(1) * BLOCK_C
    first = r.to(tl.int64) * cols + c0
    tl.store(
        out_ptr + first[:, None] + tl.arange(0, BLOCK_C)[None, :],
        kernels.rounding.philox_rows(seed_ptr, first, BLOCK_R, BLOCK_C, SHIFT),
    )


@triton.jit
def rht_random_bits_kernel(seed_ptr, out_ptr, n_tokens, GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_F: tl.constexpr):
    """out [features, n_tokens]: e2m1.random_bits_t' Philox bits (round_e2m1's addends: the byte on bits
    13..20), [GROUPS, D, BLOCK_F] tiles stored at their output indices f n_tokens + t0 + D g + j."""
    t0 = tl.program_id(0) * GROUPS * D
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    bits = kernels.e2m1.random_bits_t(
        seed_ptr, seed_ptr, f, f >= 0, t0, n_tokens, kernels.rounding.SR_PHILOX, GROUPS, D, BLOCK_F
    )
    n = (
        (f.to(tl.int64) * n_tokens + t0)[None, None, :]
        + (tl.arange(0, GROUPS) * D)[:, None, None]
        + tl.arange(0, D)[None, :, None]
    )
    tl.store(out_ptr + n, bits)


@triton.jit
def round_e2m1_kernel(
    y_ptr, bits_ptr, code_ptr, value_ptr, N: tl.constexpr, ROUNDING: tl.constexpr = kernels.rounding.SR_BITS
):
    """_round_e2m1 of y (SR with the given random words, or RNE: bits unused): code = the 4-bit E2M1 code
    from its index (int32), value = its FP32 magnitude with the sign as dense outputs form it
    (e2m1.signed_value), with a block scale of 1, NaN where y is NaN (as every kernel's scale is; codes
    masked by it, e2m1.masked_codes, as the kernels' stores do)."""
    offs = tl.program_id(0) * N + tl.arange(0, N)
    y = tl.load(y_ptr + offs)
    addend = kernels.e2m1.sr_addend(tl.load(bits_ptr + offs))
    index, magnitude, negative = kernels.e2m1.round_e2m1(y, addend, ROUNDING)
    scale = tl.where(y != y, float("nan"), 1.0)
    tl.store(code_ptr + offs, kernels.e2m1.masked_codes(index | (negative.to(tl.int32) << 3), scale != scale))
    tl.store(value_ptr + offs, kernels.e2m1.signed_value(magnitude, scale, y))


@triton.jit
def round_to_bf16_kernel(v_ptr, out_ptr, N: tl.constexpr, HW_BF16: tl.constexpr):
    """out = _round_to(v, bf16) (FP32 rounded to bf16 and widened), by the GPU's conversion or bit arithmetic."""
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + offs, kernels.common.round_to(tl.load(v_ptr + offs), tl.bfloat16, HW_BF16))


@triton.jit
def e4m3_rne_kernel(s_ptr, code_ptr, value_ptr, N: tl.constexpr):
    """code, value = nvfp4.e4m3_rne(s) (the block scales' E4M3 rounding), N elements a program."""
    offs = tl.program_id(0) * N + tl.arange(0, N)
    code, value = kernels.nvfp4.e4m3_rne(tl.load(s_ptr + offs))
    tl.store(code_ptr + offs, code)
    tl.store(value_ptr + offs, value)


@triton.jit
def abs_max_bits_kernel(v_ptr, out_ptr):
    """out[program] = common.abs_max_bits of the program's [4, 16, 8] tile of v (512 FP32 words a program)."""
    offs = (
        tl.program_id(0) * 512
        + tl.arange(0, 4)[:, None, None] * 128
        + tl.arange(0, 16)[None, :, None] * 8
        + tl.arange(0, 8)[None, None, :]
    )
    tl.store(out_ptr + tl.program_id(0), kernels.common.abs_max_bits(tl.load(v_ptr + offs)))
