"""NVFP4 (E2M1 values, E4M3 scales per 16 elements, an FP32 tensor scale): mirrors
``nvfp4._quantize_core`` and ``_quantize_impl`` / ``_fake_quantize_impl`` step by step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .amax import abs_max, abs_max_partials
from .common import (
    BLOCK_COLS,
    BLOCK_ROWS,
    FLT_MAX,
    e2m1_outputs,
    launch_options,
    store_exact,
    tile_offsets,
    to_fp32,
    with_sign,
)
from .e2m1 import masked_codes, round_and_store_rows, round_e2m1, signed_value
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
    # Normal (s >= 2^-6): round FP32's 23-bit mantissa to 3 bits, half to even (a carry into the
    # exponent is right). The rounded word, t with its low 20 bits clear, is the E4M3 value in FP32;
    # the code rebiases its exponent from 127 to 7 (120 << 3 in the shifted word).
    t = bits + 0x7FFFF + ((bits >> 20) & 1)
    # Subnormal (s < 2^-6): the code is s / 2^-9 rounded half to even (code 8 is 2^-6, the smallest
    # normal, so a round-up lands on it). s + 2^14 rounds s to a multiple of 2^-9, half to even (FP32's
    # spacing in [2^14, 2^15)): the multiple sits in the low mantissa bits (2^14's word is 0x46800000)
    # and (s + 2^14) - 2^14 is its value, exact (code * 2^-9: 2^-6 for code 8, as the normal path).
    shifted = s + 16384.0
    subnormal = s < 0.015625
    code = tl.where(subnormal, shifted.to(tl.int32, bitcast=True) - 0x46800000, (t >> 20) - (120 << 3))
    value = tl.where(subnormal, shifted - 16384.0, (t & -1048576).to(tl.float32, bitcast=True))  # 0xFFF00000
    code = tl.where(s != s, 0x7F, code)
    value = tl.where(s != s, s, value)
    return code, value


@triton.jit
def block_scales(amax_b, s_dec, multiplier):
    """(E4M3 scale bits, their FP32 value, block encode scale) of blocks with FP32 maxima amax_b (any
    shape), given the tensor's s_dec and s_enc * fp32(1/6) (global_scales, loaded from
    ``global_scales_of``'s output): nvfp4._quantize_core's scales = clamp(amax_b * s_enc / 6,
    max=448).to(e4m3) and block_encode = clamp(reciprocal(fp32(scale) * s_dec), max=FLT_MAX)."""
    scaled = amax_b * multiplier
    scale_bits, scale = e4m3_rne(tl.where(scaled > 448.0, 448.0, scaled))
    encode = tl.div_rn(tl.full(amax_b.shape, 1.0, tl.float32), scale * s_dec)
    encode = tl.where(encode > FLT_MAX, FLT_MAX, encode)
    return scale_bits, scale, encode


@triton.jit
def _nvfp4_global_scales_kernel(partial_ptr, n, scalars_ptr, amax0_ptr, s_dec0_ptr, amax1_ptr, s_dec1_ptr,
                                BLOCKS: tl.constexpr, BLOCK: tl.constexpr):
    """Row r = ``program_id`` (0 or 1) of partial [rows, n] (the int32 bits of partial maxima of |x|, as
    the amax passes store them) -> scalars[r] = (amax, s_dec, s_enc * fp32(1/6)) in FP32, and amax, s_dec
    also into the 0-d outputs of row r: the tensor scalars every quantizing program needs (global_scales),
    computed once per tensor instead of by every thread of every program (two correctly rounded divisions
    each). The max of the bits is torch.amax's: non-negative floats order as their bits, a NaN's above
    +Inf's."""
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(BLOCKS):  # BLOCKS = cdiv(n, BLOCK), a compile-time trip count: triton 3.6's interpreter
        offs = i * BLOCK + tl.arange(0, BLOCK)  # cannot loop to a run-time bound
        acc = tl.maximum(acc, tl.load(partial_ptr + row * n + offs, mask=offs < n, other=0))
    amax = tl.max(acc, axis=0).to(tl.float32, bitcast=True)
    s_enc, s_dec, multiplier = global_scales(amax)
    tl.store(scalars_ptr + 3 * row, amax)
    tl.store(scalars_ptr + 3 * row + 1, s_dec)
    tl.store(scalars_ptr + 3 * row + 2, multiplier)
    if row == 0:
        tl.store(amax0_ptr, amax)
        tl.store(s_dec0_ptr, s_dec)
    else:
        tl.store(amax1_ptr, amax)
        tl.store(s_dec1_ptr, s_dec)


def global_scales_of(partial: torch.Tensor):
    """(scalars, [(amax, s_dec) per row]) of ``partial`` (int32 [rows, n], rows 1 or 2: the bits of partial
    maxima of |x|): scalars FP32 [rows, 3] = (amax, s_dec, s_enc * fp32(1/6)), what the quantizing kernels
    load; amax and s_dec also as their own 0-d tensors (outputs that share no storage). One launch, as the
    ``torch.amax`` of the partials it replaces."""
    rows, n = partial.shape
    scalars = torch.empty((rows, 3), dtype=torch.float32, device=partial.device)
    outs = [(torch.empty((), dtype=torch.float32, device=partial.device),
             torch.empty((), dtype=torch.float32, device=partial.device)) for _ in range(rows)]
    (amax0, s_dec0), (amax1, s_dec1) = outs[0], outs[-1]
    _nvfp4_global_scales_kernel[(rows,)](partial, n, scalars, amax0, s_dec0, amax1, s_dec1,
                                         BLOCKS=triton.cdiv(n, 1024), BLOCK=1024,
                                         **launch_options(partial))
    return scalars, outs


@triton.jit
def _nvfp4_kernel(
    x_ptr, global_ptr, bits_ptr, seed_ptr,  # inputs: x [rows, cols], global_scales_of's row, SR bits or seed
    codes_ptr, scales_ptr, values_ptr,  # outputs (codes + scales, or values)
    rows, cols,
    TILE_ROWS: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    nvfp4_tile(x_ptr, global_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr,
               pid_r * BLOCK_R, pid_c * BLOCK_C, rows, cols, TILE_ROWS, ROUNDING, DENSE, BLOCK_R, BLOCK_C)


@triton.jit
def nvfp4_tile(
    x_ptr, global_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r0, c0, rows, cols,
    TILE_ROWS: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """nvfp4._quantize_core and _quantize_impl / _fake_quantize_impl for rows r0 .. r0 + BLOCK_R,
    columns c0 .. c0 + BLOCK_C of x [rows, cols]; ``global_ptr``: x's (amax, s_dec, s_enc / 6)."""
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

    scale_bits, scale, encode = block_scales(amax_b, tl.load(global_ptr + 1), tl.load(global_ptr + 2))
    # y.view(rows, nb, 16).mul_(block_encode)
    y = tl.reshape(tl.reshape(x, (BLOCK_R, NB, 16)) * encode[:, :, None], (BLOCK_R, BLOCK_C))
    round_and_store_rows(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r, c0, rows,
                         cols, ROUNDING, DENSE, 16, BLOCK_R, BLOCK_C)


# ------------------------------------------------------------------------------ TE's newer options
# nvfp4._quantize_core_te: 4over6 (two candidates a block, the smaller error kept), the 256 scale bound and
# row scaling. A program holds BLOCK_R x BLOCK_C elements as 16 [BLOCK_R, NB] tensors, element i of every
# block, loaded once as 16-byte vectors (CHUNK elements of a block) and split in registers: each thread
# owns whole blocks, so the block max, both candidates' errors summed in TE's element order (a loop, not
# a reduction tree) and the chosen codes all come from those registers, with no re-read of x. The options
# are run-time arguments, not constexprs: one compiled variant per tile height, output kind and dtype.
@triton.jit
def _encode_of(scale, s_dec):
    encode = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale * s_dec)
    return tl.where(encode > FLT_MAX, FLT_MAX, encode)


@triton.jit
def _split4(t, R: tl.constexpr, NB: tl.constexpr):
    """[R, NB, 4] -> its 4 columns [R, NB], in element order."""
    even, odd = tl.split(tl.reshape(t, (R, NB, 2, 2)))  # elements 0, 2 / 1, 3
    t0, t2 = tl.split(even)
    t1, t3 = tl.split(odd)
    return t0, t1, t2, t3


@triton.jit
def _join4(t0, t1, t2, t3, R: tl.constexpr, NB: tl.constexpr):
    """_split4's inverse: 4 columns [R, NB] -> [R, NB, 4]."""
    return tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), (R, NB, 4))


@triton.jit
def _load_columns(x_ptr, r, blk, rows, cols, R: tl.constexpr, NB: tl.constexpr, CHUNK: tl.constexpr):
    """The 16 elements of blocks ``blk`` of rows ``r`` as 16 FP32 [R, NB] tensors (a tuple), read as
    [R, NB, CHUNK] vectors (CHUNK = 16 bytes of x's dtype, so a thread's vector stays in its registers)."""
    mask = (r[:, None, None] < rows) & (blk[None, :, None] < cols // 16)
    base = r[:, None, None].to(tl.int64) * cols + blk[None, :, None] * 16
    xs = ()
    for k in tl.static_range(16 // CHUNK):
        offs = base + k * CHUNK + tl.arange(0, CHUNK)[None, None, :]
        chunk = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))
        if CHUNK == 8:
            low, high = tl.split(tl.permute(tl.reshape(chunk, (R, NB, 2, 4)), (0, 1, 3, 2)))
            xs = xs + _split4(low, R, NB) + _split4(high, R, NB)
        else:
            xs = xs + _split4(chunk, R, NB)
    return xs


@triton.jit
def _block_error(xs, encode, scale, amax, err_mode, six_bound):
    """The 4over6 error of each block under a candidate (xs: the 16 columns; encode, scale [R, NB]; amax
    [R, 1]): ((q * S) * amax) / (6 B) - x per element, |d| (err_mode 1) or d * d (2), summed in order."""
    six_b = tl.zeros(encode.shape, tl.float32) + six_bound
    err = tl.zeros(encode.shape, tl.float32)
    for i in tl.static_range(16):
        _, magnitude, negative = round_e2m1(xs[i] * encode, 0, 0)
        value = tl.div_rn((magnitude * scale) * amax, six_b)
        d = with_sign(value, negative) - xs[i]
        err = err + tl.where(err_mode == 1, tl.abs(d), d * d)
    return err


@triton.jit
def _tile_tree(err, NB: tl.constexpr):
    """[16, NB] row errors of 16x16 tiles -> the tile sums [1, NB]: rows i + i+8, then +4, +2, +1."""
    a, b = tl.split(tl.permute(tl.reshape(err, (2, 8, NB)), (1, 2, 0)))
    a, b = tl.split(tl.permute(tl.reshape(a + b, (2, 4, NB)), (1, 2, 0)))
    a, b = tl.split(tl.permute(tl.reshape(a + b, (2, 2, NB)), (1, 2, 0)))
    a, b = tl.split(tl.permute(tl.reshape(a + b, (2, 1, NB)), (1, 2, 0)))
    return a + b


@triton.jit(do_not_specialize=["amax_stride", "rows", "err_mode"])
def _nvfp4_te_kernel(
    x_ptr, amax_ptr, amax_stride, s_dec_ptr,  # x [rows, cols]; FP32 amax per row (stride 1) or per tensor (0)
    codes_ptr, scales_ptr, values_ptr,
    rows, cols,
    err_mode, six_bound,  # 0: no 4over6 (row-scaled standard NVFP4), 1: MAE, 2: MSE; 6 B in FP32
    TILE_ROWS: tl.constexpr, DENSE: tl.constexpr, CHUNK: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_C // 16
    pid_c = tl.program_id(1)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    blk = pid_c * NB + tl.arange(0, NB)
    xs = _load_columns(x_ptr, r, blk, rows, cols, BLOCK_R, NB, CHUNK)  # exact FP32

    # The global scales of these rows (nvfp4.global_encode_scale_te): amax 0 gives FLT_MAX, not 1.
    row_ok = r < rows
    amax = tl.load(amax_ptr + r * amax_stride, mask=row_ok, other=0.0)
    s_enc = tl.div_rn(tl.zeros(amax.shape, tl.float32) + six_bound, amax)
    s_enc = tl.where(s_enc > FLT_MAX, FLT_MAX, s_enc)
    s_enc = tl.where(s_enc == 0, 1.0, s_enc)
    s_enc = tl.where(amax <= FLT_MAX, s_enc, float("nan"))  # amax Inf or NaN -> NaN
    s_dec = tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    # One program column stores the rows' s_dec; a per-tensor scale only once.
    tl.store(s_dec_ptr + r * amax_stride, s_dec, mask=row_ok & (pid_c == 0) & ((amax_stride != 0) | (r == 0)))
    amax, s_enc, s_dec = amax[:, None], s_enc[:, None], s_dec[:, None]

    block_bits = xs[0].to(tl.int32, bitcast=True) & 0x7FFFFFFF
    for i in tl.static_range(1, 16):
        block_bits = tl.maximum(block_bits, xs[i].to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    if TILE_ROWS == 16:
        tile_bits = tl.max(tl.reshape(block_bits, (BLOCK_R // 16, 16, NB)), axis=1)
        block_bits = tl.reshape(tl.broadcast_to(tile_bits[:, None, :], (BLOCK_R // 16, 16, NB)), (BLOCK_R, NB))
    amax_b = block_bits.to(tl.float32, bitcast=True)

    if err_mode == 0:  # row-scaled standard NVFP4: the folded multiplier, per row
        one_sixth = tl.full(amax_b.shape, _ONE_SIXTH_BITS, tl.int32).to(tl.float32, bitcast=True)
        scale_bits, scale, encode = block_scales(amax_b, s_dec, s_enc * one_sixth)
    else:
        # divide first, then multiply; both candidates clamp at 448 whatever the bound
        base = tl.div_rn(amax_b, tl.full(amax_b.shape, 6.0, tl.float32)) * s_enc
        bits6, scale6 = e4m3_rne(tl.where(base > 448.0, 448.0, base))
        base4 = base * 1.5
        bits4, scale4 = e4m3_rne(tl.where(base4 > 448.0, 448.0, base4))
        encode6 = _encode_of(scale6, s_dec)
        encode4 = _encode_of(scale4, s_dec)
        err6 = _block_error(xs, encode6, scale6, amax, err_mode, six_bound)
        err4 = _block_error(xs, encode4, scale4, amax, err_mode, six_bound)
        if TILE_ROWS == 16:
            pick4 = tl.broadcast_to(_tile_tree(err4, NB) < _tile_tree(err6, NB), (BLOCK_R, NB))
        else:
            pick4 = err4 < err6  # strict: ties and NaN keep map-to-6
        scale_bits = tl.where(pick4, bits4, bits6)
        scale = tl.where(pick4, scale4, scale6)
        encode = tl.where(pick4, encode4, encode6)

    mask = (r[:, None] < rows) & (blk[None, :] < cols // 16)
    row_offs = r[:, None].to(tl.int64) * cols + blk[None, :] * 16  # the blocks' first elements
    if DENSE:  # e2m1 * fp32(scale), the sign of y (signed_value), 4 columns a vector store
        for k in tl.static_range(4):
            v = ()
            for j in tl.static_range(4):
                y = xs[4 * k + j] * encode
                _, magnitude, _ = round_e2m1(y, 0, 0)
                v = v + (signed_value(magnitude, scale, y),)
            offs = row_offs[:, :, None] + 4 * k + tl.arange(0, 4)[None, None, :]
            store_exact(values_ptr, offs, _join4(v[0], v[1], v[2], v[3], BLOCK_R, NB), mask[:, :, None])
    else:  # packed codes (element 2j in the low nibble, sign in bit 3), 4 bytes a vector store; scale bytes
        scale_is_nan = scale != scale
        for k in tl.static_range(2):
            b = ()
            for j in tl.static_range(4):
                index0, _, negative0 = round_e2m1(xs[8 * k + 2 * j] * encode, 0, 0)
                index1, _, negative1 = round_e2m1(xs[8 * k + 2 * j + 1] * encode, 0, 0)
                code = (index0 | (negative0.to(tl.int32) << 3)) | ((index1 | (negative1.to(tl.int32) << 3)) << 4)
                b = b + (masked_codes(code, scale_is_nan).to(tl.uint8),)
            offs = (row_offs[:, :, None] // 2) + 4 * k + tl.arange(0, 4)[None, None, :]
            tl.store(codes_ptr + offs, _join4(b[0], b[1], b[2], b[3], BLOCK_R, NB), mask=mask[:, :, None])
        tl.store(scales_ptr + r[:, None].to(tl.int64) * (cols // 16) + blk[None, :], scale_bits.to(tl.uint8),
                 mask=mask)


def quantize_te(x: torch.Tensor, tile_rows: int, four_over_six, scale_bound: int, row_scaled: bool, *, dense: bool,
                out_dtype: torch.dtype | None = None):
    """nvfp4._quantize_core_te on the GPU (arguments checked by the caller; RNE): outputs as ``quantize``, amax
    and s_dec 0-d or [..., 1]. One pass for the amax (the plain quantizer's, or a per-row max), one kernel for
    the global scales and the blocks."""
    x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    if row_scaled:  # max |x| per row, one pass (exact: no arithmetic), NaN propagating
        amax = torch.linalg.vector_norm(x.reshape(rows, cols), float("inf"), dim=1).to(torch.float32)
        s_dec = torch.empty_like(amax)
    else:
        amax = abs_max(x)
        s_dec = torch.empty((), dtype=torch.float32, device=x.device)
    codes, scales, values = e2m1_outputs(x.shape, 16, dense, out_dtype or x.dtype, x.device, unused=amax)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _nvfp4_te_kernel[grid](
        x, amax, 1 if row_scaled else 0, s_dec, codes, scales, values, rows, cols,
        {None: 0, "mae": 1, "mse": 2}[four_over_six], 6.0 * scale_bound,
        TILE_ROWS=tile_rows, DENSE=dense, CHUNK=8 if x.element_size() == 2 else 4, BLOCK_R=BLOCK_ROWS,
        BLOCK_C=BLOCK_COLS, **launch_options(x),
    )
    if row_scaled:
        amax, s_dec = amax.reshape(*x.shape[:-1], 1), s_dec.reshape(*x.shape[:-1], 1)
    if dense:
        return values, amax, s_dec
    return codes, scales, amax, s_dec


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
    four_over_six: str | None = None,
    scale_bound: int = 448,
    row_scaled: bool = False,
):
    """NVFP4 of ``x`` viewed as [rows, cols] (arguments checked by the caller).

    dense=False: (codes uint8 [..., cols/2], scales uint8 E4M3 bits [..., cols/16], amax, s_dec).
    dense=True: (values e2m1 * scale_b in out_dtype, x's shape; amax; s_dec).
    SR uses ``random_bits`` (int32, one per element, as ``rounding.random_bits_like``: the same
    bits as the reference) when given, else Philox seeded from ``seed`` (int64 [1]) or from a seed
    drawn from ``generator``. four_over_six / scale_bound / row_scaled: TE's options (``quantize_te``)."""
    if four_over_six is not None or row_scaled:
        return quantize_te(x, tile_rows, four_over_six, scale_bound, row_scaled, dense=dense, out_dtype=out_dtype)
    x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    device = x.device
    scalars, [(amax, s_dec)] = global_scales_of(abs_max_partials(x)[None])  # scalars: amax, s_dec, s_enc / 6
    mode, bits, seed = rounding_args(x, rounding, random_bits, generator, seed)
    codes, scales, values = e2m1_outputs(x.shape, 16, dense, out_dtype or x.dtype, device, unused=amax)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _nvfp4_kernel[grid](
        x, scalars[0], bits, seed, codes, scales, values, rows, cols,
        TILE_ROWS=tile_rows, ROUNDING=mode, DENSE=dense, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
        **launch_options(x),
    )
    if dense:
        return values, amax, s_dec
    return codes, scales, amax, s_dec

