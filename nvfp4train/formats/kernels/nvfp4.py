"""NVFP4 (E2M1 values, E4M3 scales per 16 elements, an FP32 tensor scale): mirrors
``nvfp4._quantize_core`` and ``_quantize_impl`` / ``_fake_quantize_impl`` step by step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .amax import abs_max
from .common import BLOCK_COLS, BLOCK_ROWS, FLT_MAX, e2m1_outputs, launch_options, tile_offsets, to_fp32
from .e2m1 import round_and_store_rows
from .rounding import rounding_args

_ONE_SIXTH_BITS = tl.constexpr(0x3E2AAAAB)  # fp32(1/6) = torch.reciprocal(torch.tensor(6.0)), as the reference


@triton.jit
def global_scales(amax):
    """(s_enc, s_dec, s_enc * fp32(1/6)) from the FP32 amax: nvfp4.global_encode_scale and the
    two lines after it in nvfp4._quantize_core."""
    s_enc = tl.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax)  # 6 * 448 / amax, one rounding
    s_enc = tl.where(s_enc > FLT_MAX, FLT_MAX, s_enc)  # clamp(max=FLT_MAX); NaN stays NaN
    s_enc = tl.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    s_enc = tl.where(amax <= FLT_MAX, s_enc, float("nan"))  # amax Inf or NaN -> NaN
    s_dec = tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    one_sixth = tl.full(amax.shape, _ONE_SIXTH_BITS, tl.int32).to(tl.float32, bitcast=True)
    return s_enc, s_dec, s_enc * one_sixth


@triton.jit
def e4m3_rne(s):
    """FP32 s in [0, 448] or NaN -> (E4M3 bits int32, fp32 value of those bits): torch's
    ``.to(torch.float8_e4m3fn)`` (RNE) then ``.to(torch.float32)``."""
    bits = s.to(tl.int32, bitcast=True)
    # Normal (s >= 2^-6): round FP32's 23-bit mantissa to 3 bits, half to even, then rebias the
    # exponent from 127 to 7 (120 << 3 in the shifted word). A carry into the exponent is right.
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)
    # Subnormal (s < 2^-6): the code is s / 2^-9 rounded half to even (code 8 is 2^-6, the smallest
    # normal, so a round-up lands on it). s * 512 < 8 is exact; adding 2^23 rounds it to an integer
    # (FP32 spacing 1 there) and the integer sits in the low mantissa bits.
    subnormal = ((s * 512.0) + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    code = tl.where(s < 0.015625, subnormal, normal)
    code = tl.where(s != s, 0x7F, code)
    normal_value = ((code + (120 << 3)) << 20).to(tl.float32, bitcast=True)
    value = tl.where(code >= 8, normal_value, code.to(tl.float32) * 0.001953125)  # subnormal: code * 2^-9
    value = tl.where(s != s, s, value)
    return code, value


@triton.jit
def block_scales(amax_b, amax):
    """(E4M3 scale bits, their FP32 value, block encode scale, s_dec) of blocks with FP32 maxima amax_b
    (any shape) in a tensor of FP32 amax: nvfp4._quantize_core's scales = clamp(amax_b * s_enc / 6,
    max=448).to(e4m3) and block_encode = clamp(reciprocal(fp32(scale) * s_dec), max=FLT_MAX)."""
    s_enc, s_dec, multiplier = global_scales(amax)
    scaled = amax_b * multiplier
    scale_bits, scale = e4m3_rne(tl.where(scaled > 448.0, 448.0, scaled))
    encode = tl.div_rn(tl.full(amax_b.shape, 1.0, tl.float32), scale * s_dec)
    encode = tl.where(encode > FLT_MAX, FLT_MAX, encode)
    return scale_bits, scale, encode, s_dec

@triton.jit
def _nvfp4_kernel(
    x_ptr, amax_ptr, bits_ptr, seed_ptr,  # inputs: x [rows, cols], 0-d amax, SR bits or seed
    codes_ptr, scales_ptr, values_ptr, s_dec_ptr,  # outputs (codes + scales, or values)
    rows, cols,
    TILE_ROWS: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    s_dec = nvfp4_tile(x_ptr, amax_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr,
                        pid_r * BLOCK_R, pid_c * BLOCK_C, rows, cols, TILE_ROWS, ROUNDING, DENSE, BLOCK_R, BLOCK_C)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(s_dec_ptr, s_dec)


@triton.jit
def nvfp4_tile(
    x_ptr, amax_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r0, c0, rows, cols,
    TILE_ROWS: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """nvfp4._quantize_core and _quantize_impl / _fake_quantize_impl for rows r0 .. r0 + BLOCK_R,
    columns c0 .. c0 + BLOCK_C of x [rows, cols]; returns s_dec."""
    NB: tl.constexpr = BLOCK_C // 16
    r, c, mask, offs = tile_offsets(r0, c0, rows, cols, BLOCK_R, BLOCK_C)
    x = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))  # y = x.to(float32): exact

    # block_amax: max over 16 columns, and for a 16x16 tile over its 16 rows, repeated on them.
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    block_bits = tl.max(tl.reshape(magnitude_bits, (BLOCK_R, NB, 16)), axis=2)
    if TILE_ROWS == 16:
        tile_bits = tl.max(tl.reshape(block_bits, (BLOCK_R // 16, 16, NB)), axis=1)
        block_bits = tl.reshape(tl.broadcast_to(tile_bits[:, None, :], (BLOCK_R // 16, 16, NB)), (BLOCK_R, NB))
    amax_b = block_bits.to(tl.float32, bitcast=True)

    scale_bits, scale, encode, s_dec = block_scales(amax_b, tl.load(amax_ptr))
    # y.view(rows, nb, 16).mul_(block_encode)
    y = tl.reshape(tl.reshape(x, (BLOCK_R, NB, 16)) * encode[:, :, None], (BLOCK_R, BLOCK_C))
    round_and_store_rows(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r, c0, rows,
                         cols, ROUNDING, DENSE, 16, BLOCK_R, BLOCK_C)
    return s_dec


def quantize(
    x: torch.Tensor,
    tile_rows: int,
    rounding: str,
    *,
    dense: bool,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    out_dtype: torch.dtype | None = None,
    seed: torch.Tensor | None = None,
):
    """NVFP4 of ``x`` viewed as [rows, cols] (arguments checked by the caller).

    dense=False: (codes uint8 [..., cols/2], scales uint8 E4M3 bits [..., cols/16], amax, s_dec).
    dense=True: (values e2m1 * scale_b in out_dtype, x's shape; amax; s_dec).
    SR uses ``random_bits`` (int32, one per element, as ``rounding.random_bits_like``: the same
    bits as the reference) when given, else Philox seeded from ``seed`` (int64 [1]) or from a seed
    drawn from ``generator``."""
    x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    device = x.device
    amax = abs_max(x)
    s_dec = torch.empty((), dtype=torch.float32, device=device)
    mode, bits, seed = rounding_args(x, rounding, random_bits, generator, seed)
    codes, scales, values = e2m1_outputs(x.shape, 16, dense, out_dtype or x.dtype, device, unused=amax)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _nvfp4_kernel[grid](
        x, amax, bits, seed, codes, scales, values, s_dec, rows, cols,
        TILE_ROWS=tile_rows, ROUNDING=mode, DENSE=dense, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
        **launch_options(x),
    )
    if dense:
        return values, amax, s_dec
    return codes, scales, amax, s_dec

