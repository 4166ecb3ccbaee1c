"""E2M1 rounding (``e2m1.round_signed_``: RNE and SR read off one FP32 addition's bits) and the two store
tails that follow it: the row-wise one the NVFP4 and MXFP4 kernels share, and the transposed one of the
Wgrad (RHT) kernels (dense values, or packed codes + scale bits)."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import store_exact
from .rounding import philox_rows

_SR_DROPPED_BITS = tl.constexpr((1 << 21) - 1)  # e2m1._SR_DROPPED_BITS: the bits below the E2M1 step
_SR_SHIFT = tl.constexpr(13)  # e2m1._SR_SHIFT: a random byte lands on the top 8 of the 21 dropped bits


@triton.jit
def e2m1_magnitude(index):
    """Index 0..7 -> E2M1 magnitude (FP32): 0 and 0.5 below index 2, else the FP32 word with biased
    exponent and one mantissa bit (index + 252) << 22 (1, 1.5, 2, 3, 4, 6)."""
    return tl.where(index >= 2, ((index + 252) << 22).to(tl.float32, bitcast=True), index.to(tl.float32) * 0.5)


@triton.jit
def sr_addend(words):
    """SR's random byte (the low 8 bits of int32 ``words``, e2m1.round_signed_'s ``random_bits``) moved
    onto the top 8 of the 21 bits below the E2M1 step, as round_e2m1 adds it."""
    return (words & 0xFF) << _SR_SHIFT


@triton.jit
def round_e2m1(y, addend, ROUNDING: tl.constexpr):
    """e2m1.round_signed_ on FP32 y: (index 0..7 of the rounded magnitude, that magnitude in FP32,
    negative). Codes take the index, dense values the magnitude: a kernel computes only what it uses
    (the compiler drops the other). The index and magnitude of a NaN are unspecified: a NaN y has a NaN
    block scale (see signed_value), which makes a dense value NaN whatever the magnitude, and a caller
    storing codes clears every code of a block whose scale is NaN (masked_codes): the reference's code 0
    for each of them, as all of that block's y are NaN then (e2m1.encode_values maps NaN to code 0).
    ``negative`` is y < 0 (the reference's ``y + 0.0`` makes -0 positive), so a negative value that rounds
    to 0 keeps its sign bit (code 0x8), as in TE. SR (ROUNDING != 0) adds
    ``addend`` (int32, y's shape: the random byte already on bits 13..20, ``sr_addend`` or
    ``philox_rows(..., SHIFT=13)``) to z's bits.

    Both roundings are the reference's own FP32 addition, read off the bits. offset = max(2^floor(log2
    |y|), 1) = 2^k (an integer max of the bits: the same order for non-negative floats); the E2M1 grid
    step is offset / 2 there, and index m + 2k is m steps above offset (m = 0..4; k = 0 below 2, where
    the grid starts at 0; m = 4 is the next binade's first point). The additions are FMAs of offset
    by a power of two: the product is exact, so fma(offset, 2^p, a) rounds a + 2^p offset once, as
    the reference's addition does (and the subtraction of an exact result is exact)."""
    negative = y < 0
    a = tl.abs(y)
    a = tl.minimum(a, 6.0, propagate_nan=tl.PropagateNan.ALL)  # clamp_(-6, 6); NaN stays NaN (one min.NaN)
    offset_bits = tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000)
    offset = offset_bits.to(tl.float32, bitcast=True)
    if ROUNDING != 0:
        # z = |y| + 2 offset (one FP32 rounding, to 2^-21 of a step) lies in [2, 4) offset; the random
        # byte is added to the top 8 of the 21 bits below the step and those are cleared:
        # z' = 2 offset + m offset / 2. z' >> 21 is its biased exponent and top 2 mantissa bits,
        # 4 (128 + k) + m, and offset_bits >> 22 = 2 (127 + k): the index is
        # (z_bits >> 21) - (offset_bits >> 22) - 258.
        z_bits = tl.fma(offset, 2.0, a).to(tl.int32, bitcast=True) + addend
        index = (z_bits - (offset_bits >> 1) - (258 << 21)) >> 21
        # z' - 2 offset, exact. A NaN a gives any magnitude (a GPU's NaN 0x7FFFFFFF plus the byte carries
        # into the sign): unspecified, as documented above.
        magnitude = tl.fma(offset, -2.0, (z_bits & ~_SR_DROPPED_BITS).to(tl.float32, bitcast=True))
    else:
        # z = |y| + 2^22 offset lies in [2^22, 2^23) offset, where FP32's spacing is offset / 2: the
        # addition rounds |y| onto the grid, half to even on the step count m (ties to the even code,
        # TE's decision table), and z's word is 2^22 offset's plus m. z - 2^22 offset is exact.
        base_bits = offset_bits + (22 << 23)
        z = tl.fma(offset, 4194304.0, a)
        index = z.to(tl.int32, bitcast=True) - base_bits + ((offset_bits >> 22) - 254)
        magnitude = tl.fma(offset, -4194304.0, z)
    return index, magnitude, negative


@triton.jit
def masked_codes(code, scale_is_nan):
    """E2M1 codes (or bytes of packed codes) of a block, all 0 where the block's scale is NaN
    (``scale_is_nan`` broadcast to code's shape): the NaN y of round_e2m1 take code 0 in the reference
    (e2m1.encode_values), and a block with a NaN scale has only NaN y (NVFP4: the NaN encode scale
    multiplies every y of the tensor; MXFP4: the block's), while a block with a finite scale has none.
    One select a block's byte (or pair) instead of one an element."""
    return tl.where(scale_is_nan, 0, code)


@triton.jit
def signed_value(magnitude, scale, y):
    """The dense output of round_e2m1's magnitude: magnitude * scale with y's sign where y < 0
    (with_sign(magnitude * scale, y < 0)), in 2 instructions instead of 3: y + 0.0 is y with -0.0 made
    +0.0 (round to nearest), so its sign bit is set exactly where y < 0, NaN aside. A NaN y has a NaN
    block scale in every kernel here (NVFP4: y = x * encode is NaN only for a NaN x or encode, and either
    makes the tensor amax non-finite, so s_enc and every block scale NaN; MXFP4: only for a NaN x or
    inverse, either makes its block's scale NaN), so the product is NaN whatever magnitude and sign
    round_e2m1 gave it."""
    sign = (y + 0.0).to(tl.int32, bitcast=True) & -2147483648  # 0x80000000
    return ((magnitude * scale).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def round_and_store_rows(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r, c0, rows,
                          cols, ROUNDING: tl.constexpr, DENSE: tl.constexpr, GROUP: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The row-wise NVFP4 / MXFP4 kernels' common tail: y [BLOCK_R, BLOCK_C] (rows r, columns c0 ..
    c0 + BLOCK_C of [rows, cols]) already divided by its GROUP-element block scale is rounded onto E2M1
    (RNE, SR with loaded bits, or Philox SR) and stored as dense values (_fake_quantize_impl: grid value x
    fp32(scale), exact; NaN scales give NaN) or as packed codes + scale bits (e2m1.encode_values + pack:
    sign in bit 3, element 2j in the low nibble)."""
    NB: tl.constexpr = BLOCK_C // GROUP
    c = c0 + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r[:, None].to(tl.int64) * cols + c[None, :]
    if ROUNDING == 1:
        random_bits = sr_addend(tl.load(bits_ptr + offs, mask=mask, other=0))
    elif ROUNDING == 2:
        # Rows start at multiples of 16 (cols is one), as philox_rows asks.
        random_bits = philox_rows(seed_ptr, r.to(tl.int64) * cols + c0, BLOCK_R, BLOCK_C, _SR_SHIFT)
    else:
        random_bits = 0
    index, grid_magnitude, negative = round_e2m1(y, random_bits, ROUNDING)

    if DENSE:
        values = signed_value(tl.reshape(grid_magnitude, (BLOCK_R, NB, GROUP)), scale[:, :, None],
                              tl.reshape(y, (BLOCK_R, NB, GROUP)))
        store_exact(values_ptr, offs, tl.reshape(values, (BLOCK_R, BLOCK_C)), mask)
    else:
        code = tl.reshape(index | (negative.to(tl.int32) << 3), (BLOCK_R, NB, GROUP))
        code = tl.reshape(masked_codes(code, (scale != scale)[:, :, None]), (BLOCK_R, BLOCK_C))
        low, high = tl.split(tl.reshape(code, (BLOCK_R, BLOCK_C // 2, 2)))
        c2 = c0 // 2 + tl.arange(0, BLOCK_C // 2)
        mask2 = (r[:, None] < rows) & (c2[None, :] < cols // 2)
        tl.store(codes_ptr + r[:, None].to(tl.int64) * (cols // 2) + c2[None, :],
                 (low | (high << 4)).to(tl.uint8), mask=mask2)
        cb = c0 // GROUP + tl.arange(0, NB)
        maskb = (r[:, None] < rows) & (cb[None, :] < cols // GROUP)
        tl.store(scales_ptr + r[:, None].to(tl.int64) * (cols // GROUP) + cb[None, :], scale_bits.to(tl.uint8),
                 mask=maskb)


# ------------------------------------------------------------------------------ transposed (Wgrad) tail
@triton.jit
def output_offsets(f, row_len, first, N: tl.constexpr):
    """[BLOCK_F, N] offsets of elements first .. first + N of rows f of a row-major output."""
    return f[:, None].to(tl.int64) * row_len + first + tl.arange(0, N)[None, :]


@triton.jit
def to_output_rows(v, GROUPS: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr):
    """[GROUPS, K, BLOCK_F] (K output elements per group and feature) -> [BLOCK_F, GROUPS K], row f
    the GROUPS K consecutive elements of output row f: stores then write one contiguous run per
    feature (not K elements per group)."""
    return tl.reshape(tl.permute(v, (2, 0, 1)), (BLOCK_F, GROUPS * K))


@triton.jit
def random_bits_t(bits_ptr, seed_ptr, f, mask_f, t0, n_tokens, ROUNDING: tl.constexpr, GROUPS: tl.constexpr,
                     D: tl.constexpr, BLOCK_F: tl.constexpr):
    """SR's random bits for the [GROUPS, D, BLOCK_F] tile at tokens t0, indexed in the [features,
    tokens] output: words loaded from ``bits_ptr`` (ROUNDING 1) or Philox bytes from the seed
    (ROUNDING 2; an element's byte depends on its output index only, so these are the bits
    ``mxfp4.quantize`` / ``nvfp4.quantize`` draw for the materialized operand from the same seed). Row f's first
    index f n_tokens + t0 is a multiple of 16 (n_tokens is one of D, t0 of GROUPS D), as
    philox_rows asks. Drawn as a [BLOCK_F, GROUPS D] tile and permuted: the compiler relabels the
    registers (the same machine code as drawing the bytes in the [GROUPS, D, BLOCK_F] layout
    directly, formats/kernels/sm90.py, 2026-11)."""
    if ROUNDING == 1:
        words = sr_addend(tl.load(bits_ptr + output_offsets(f, n_tokens, t0, GROUPS * D), mask=mask_f[:, None],
                                  other=0))
    else:
        words = philox_rows(seed_ptr, f.to(tl.int64) * n_tokens + t0, BLOCK_F, GROUPS * D, _SR_SHIFT)
    return tl.permute(tl.reshape(words, (BLOCK_F, GROUPS, D)), (1, 2, 0))


@triton.jit
def store_e2m1_t(codes_ptr, scales_ptr, index, negative, scale, scale_bits, f, mask_f, t0, n_tokens,
                  GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_F: tl.constexpr):
    """Packed codes [features, tokens / 2] and scale bits [features, tokens / D] of the
    [GROUPS, D, BLOCK_F] tile at tokens t0 (e2m1.encode_values + pack: sign in bit 3, the even
    element of a pair in the low nibble; blocks with a NaN ``scale``, [GROUPS, BLOCK_F], all 0)."""
    code = index | (negative.to(tl.int32) << 3)
    nibble_weight = (1 + 15 * tl.arange(0, 2))[None, None, :, None]
    packed = tl.sum(tl.reshape(code, (GROUPS, D // 2, 2, BLOCK_F)) * nibble_weight, axis=2)  # [GROUPS, D/2, BLOCK_F]
    packed = masked_codes(packed, (scale != scale)[:, None, :])
    tl.store(codes_ptr + output_offsets(f, n_tokens // 2, t0 // 2, GROUPS * D // 2),
             to_output_rows(packed, GROUPS, D // 2, BLOCK_F).to(tl.uint8), mask=mask_f[:, None])
    tl.store(scales_ptr + output_offsets(f, n_tokens // D, t0 // D, GROUPS),
             tl.permute(scale_bits, (1, 0)).to(tl.uint8), mask=mask_f[:, None])


@triton.jit
def round_and_store_t(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, f, mask_f, t0,
                       n_tokens, ROUNDING: tl.constexpr, DENSE: tl.constexpr, GROUPS: tl.constexpr, D: tl.constexpr,
                       BLOCK_F: tl.constexpr):
    """The Wgrad kernels' common tail: y [GROUPS, D, BLOCK_F] already divided by its block scale is
    rounded onto E2M1 (RNE or SR) and stored transposed, as dense values (x scale) or codes + scales."""
    if ROUNDING != 0:
        random_bits = random_bits_t(bits_ptr, seed_ptr, f, mask_f, t0, n_tokens, ROUNDING, GROUPS, D, BLOCK_F)
    else:
        random_bits = 0
    index, grid_magnitude, negative = round_e2m1(y, random_bits, ROUNDING)
    if DENSE:
        values = signed_value(grid_magnitude, scale[:, None, :], y)
        store_exact(values_ptr, output_offsets(f, n_tokens, t0, GROUPS * D),
                  to_output_rows(values, GROUPS, D, BLOCK_F), mask_f[:, None])
    else:
        store_e2m1_t(codes_ptr, scales_ptr, index, negative, scale, scale_bits, f, mask_f, t0, n_tokens, GROUPS, D,
                      BLOCK_F)
