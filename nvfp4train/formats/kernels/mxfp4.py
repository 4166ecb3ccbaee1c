"""MXFP4 (E2M1 values, E8M0 power-of-two scales per 32 elements): mirrors ``mxfp4._quantize_core`` and
``_quantize_impl`` / ``_fake_quantize_impl``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import BLOCK_COLS, BLOCK_ROWS, FLT_MAX, e2m1_outputs, launch_options, tile_offsets, to_fp32
from .e2m1 import round_and_store_rows
from .rounding import rounding_args


@triton.jit
def _e8m0_exponent_bits(amax_b, SCALE_RULE: tl.constexpr):
    """mxfp4.scale_exponent + 127, from the FP32 bits (E8M0 bits 0..254; 255 for a non-finite
    block). SCALE_RULE 0: rceil, 2^ceil(log2(amax_b / 6)); 1: floor, 2^(floor(log2 amax_b) - 2)."""
    if SCALE_RULE == 0:
        v = tl.div_rn(amax_b, tl.full(amax_b.shape, 6.0, tl.float32))  # block_amax / E2M1_MAX
        bits = v.to(tl.int32, bitcast=True)
        biased, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
        # frexp's exact ceil(log2 v): the exponent, plus one unless v is a power of two. A
        # subnormal v lies in (2^-149, 2^-126): ceil(log2 v) is -126 above 2^-127, else <= -127.
        e = tl.where(biased > 0, biased - 127 + (mantissa != 0).to(tl.int32),
                     tl.where(mantissa > 0x400000, -126, -127))
    else:
        bits = amax_b.to(tl.int32, bitcast=True)
        biased = (bits >> 23) & 0xFF
        e = tl.where(biased > 0, biased - 127 - 2, -127)  # a subnormal amax_b gives <= -128: clamped
    e = tl.where(amax_b == 0, -127, e)
    e = tl.minimum(tl.maximum(e, -127), 127)
    return tl.where(amax_b <= FLT_MAX, e + 127, 255)  # E8M0_NAN for Inf / NaN


@triton.jit
def e8m0_scales(amax_b, SCALE_RULE: tl.constexpr):
    """(E8M0 bits, FP32 scale 2^(bits - 127), its reciprocal) of each block from its FP32 amax:
    mxfp4._quantize_core's bits, scale_from_e8m0(bits) and reciprocal(scale) (exact)."""
    scale_bits = _e8m0_exponent_bits(amax_b, SCALE_RULE)
    # scale_from_e8m0: 2^(bits - 127); bits 0 is 2^-127 (an FP32 subnormal), 255 NaN.
    scale = tl.where(scale_bits == 0, (1 << 22), scale_bits << 23).to(tl.float32, bitcast=True)
    scale = tl.where(scale_bits == 255, float("nan"), scale)
    inverse = tl.div_rn(tl.full(amax_b.shape, 1.0, tl.float32), scale)
    return scale_bits, scale, inverse


@triton.jit
def _mxfp4_kernel(
    x_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, rows, cols,
    SCALE_RULE: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """mxfp4._quantize_core + _quantize_impl / _fake_quantize_impl for a BLOCK_R x BLOCK_C tile."""
    NB: tl.constexpr = BLOCK_C // 32
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r, c, mask, offs = tile_offsets(pid_r * BLOCK_R, pid_c * BLOCK_C, rows, cols, BLOCK_R, BLOCK_C)
    x = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))

    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax_b = tl.max(tl.reshape(magnitude_bits, (BLOCK_R, NB, 32)), axis=2).to(tl.float32, bitcast=True)
    scale_bits, scale, inverse = e8m0_scales(amax_b, SCALE_RULE)
    y = tl.reshape(tl.reshape(x, (BLOCK_R, NB, 32)) * inverse[:, :, None], (BLOCK_R, BLOCK_C))
    round_and_store_rows(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r,
                         pid_c * BLOCK_C, rows, cols, ROUNDING, DENSE, 32, BLOCK_R, BLOCK_C)


def quantize(
    x: torch.Tensor,
    scale_rule: str,
    rounding: str,
    *,
    dense: bool,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    out_dtype: torch.dtype | None = None,
):
    """MXFP4 of ``x`` viewed as [rows, cols] (arguments checked by the caller; ``scale_rule``
    canonical). dense=False: (codes uint8 [..., cols/2], E8M0 scale bits uint8 [..., cols/32]);
    dense=True: values e2m1 * 2^e in out_dtype, x's shape. SR bits as in ``nvfp4``."""
    x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    mode, bits, seed = rounding_args(x, rounding, random_bits, generator)
    codes, scales, values = e2m1_outputs(x.shape, 32, dense, out_dtype or x.dtype, x.device)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _mxfp4_kernel[grid](
        x, bits, seed, codes, scales, values, rows, cols,
        SCALE_RULE={"rceil": 0, "floor": 1}[scale_rule], ROUNDING=mode, DENSE=dense,
        BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS, **launch_options(x),
    )
    return values if dense else (codes, scales)

