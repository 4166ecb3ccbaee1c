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
def philox_rows_kernel(seed_ptr, out_ptr, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out [rows, cols]: _philox_rows' bits, drawn in BLOCK_R x BLOCK_C tiles."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c0 = tl.program_id(1) * BLOCK_C
    first = r.to(tl.int64) * cols + c0
    tl.store(
        out_ptr + first[:, None] + tl.arange(0, BLOCK_C)[None, :],
        kernels.rounding.philox_rows(seed_ptr, first, BLOCK_R, BLOCK_C),
    )


@triton.jit
def rht_random_bits_kernel(seed_ptr, out_ptr, n_tokens, GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_F: tl.constexpr):
    """out [features, n_tokens]: e2m1.random_bits_t' Philox bits, [GROUPS, D, BLOCK_F] tiles stored at
    their output indices f n_tokens + t0 + D g + j."""
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
    from its index (int32), value = its FP32 magnitude with the sign (what dense outputs use)."""
    offs = tl.program_id(0) * N + tl.arange(0, N)
    index, magnitude, negative = kernels.e2m1.round_e2m1(tl.load(y_ptr + offs), tl.load(bits_ptr + offs), ROUNDING)
    tl.store(code_ptr + offs, index | (negative.to(tl.int32) << 3))
    tl.store(value_ptr + offs, kernels.common.with_sign(magnitude, negative))


@triton.jit
def round_to_bf16_kernel(v_ptr, out_ptr, N: tl.constexpr, HW_BF16: tl.constexpr):
    """out = _round_to(v, bf16) (FP32 rounded to bf16 and widened), by the GPU's conversion or bit arithmetic."""
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + offs, kernels.common.round_to(tl.load(v_ptr + offs), tl.bfloat16, HW_BF16))
