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
    INTERPRETED,
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
# a reduction tree) and the chosen codes all come from those registers, with no re-read of x. The error mode
# is a constexpr (MODE: 0 no 4over6, 1 MAE, 2 MSE; a run uses one), the bound and row scaling are run-time
# arguments: one compiled variant per mode, tile height, output kind and dtype.
@triton.jit
def _encode_of(scale, s_dec):
    encode = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale * s_dec)
    return tl.where(encode > FLT_MAX, FLT_MAX, encode)


@triton.jit
def _bounded_global_scales(amax, six_bound):
    """nvfp4.global_encode_scale_te with the 4over6 bound (6 x 448 or 6 x 256): amax 0 gives FLT_MAX, not 1;
    amax Inf or NaN gives NaN. Returns (s_enc, s_dec)."""
    s_enc = tl.div_rn(tl.zeros(amax.shape, tl.float32) + six_bound, amax)
    s_enc = tl.where(s_enc > FLT_MAX, FLT_MAX, s_enc)
    s_enc = tl.where(s_enc == 0, 1.0, s_enc)
    s_enc = tl.where(amax <= FLT_MAX, s_enc, float("nan"))
    s_dec = tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    return s_enc, s_dec


@triton.jit
def _four_over_six_candidates(amax_b, s_enc, s_dec):
    """A block's two 4over6 candidates, amax mapped to 6 and to 4: (bits, scale, encode) of each. TE divides
    first, then multiplies, and clamps both at 448 whatever the bound."""
    base = tl.div_rn(amax_b, tl.full(amax_b.shape, 6.0, tl.float32)) * s_enc
    bits6, scale6 = e4m3_rne(tl.where(base > 448.0, 448.0, base))
    base4 = base * 1.5
    bits4, scale4 = e4m3_rne(tl.where(base4 > 448.0, 448.0, base4))
    return bits6, scale6, _encode_of(scale6, s_dec), bits4, scale4, _encode_of(scale4, s_dec)


# The error of a candidate needs ((q * S) * amax) / (6 B) for each element's E2M1 magnitude q. q * S is exact
# (at most 6 significant bits), and q = 2^k * f with f = 1 or 1.5 (or q = 0): while the product with amax and
# the quotient stay in FP32's normal range, scaling by 2^k commutes with both roundings, so the value is
# 2^k * V_f with V_f = ((f * S) * amax) / (6 B), two divisions a block instead of one an element. It stays
# there for every block when the tensor's (row's) amax lies in [2^-80, 2^115]: the smallest product, with
# S = 2^-9 (E4M3's smallest) and q = 0.5, is 2^-90 or more, its quotient over 2^-102, and the largest,
# 6 x 448 x amax, is below 2^127. amax 0 (every S and value 0) and Inf or NaN (NaN errors: map-to-6 either
# way) take the same path; a program with a row outside (_needs_exact_values) sums the reference's formula.
_VALUES_MIN = tl.constexpr(2.0**-80)
_VALUES_MAX = tl.constexpr(2.0**115)
_GPU = tl.constexpr(not INTERPRETED)


@triton.jit
def _needs_exact_values(amax):
    return (amax > 0) & ((amax < _VALUES_MIN) | ((amax > _VALUES_MAX) & (amax <= FLT_MAX)))


@triton.jit
def _div_six_b(p, six_b, inv_six_b):
    """fl(p / (6 B)) for p 0 or in [2^-100, 2^127]. On the GPU by Markstein's correction from fl(1 / (6 B)): the
    residual fma(-q, 6 B, p) is exact and one more FMA rounds the quotient correctly, for every FP32 significand of
    p and both bounds (test_triton_4over6.py checks all of them); the interpreter's FMA rounds twice, so there it
    divides."""
    if _GPU:
        q = p * inv_six_b
        return tl.fma(tl.fma(q, -six_b, p), inv_six_b, q)  # -six_b: once, a scalar (Triton's minus is 0 - x)
    else:
        return tl.div_rn(p, six_b)


@triton.jit
def _error_values(scale, amax, six_b, inv_six_b):
    """(V_1, V_1.5) of candidates with scales ``scale``: ((f * S) * amax) / (6 B), f * S exact."""
    return _div_six_b(scale * amax, six_b, inv_six_b), _div_six_b((scale * 1.5) * amax, six_b, inv_six_b)


@triton.jit
def _element_error(ax, encode, v1, v15, MODE: tl.constexpr, CLAMP: tl.constexpr):
    """(E2M1 magnitude of |x| * encode, its 4over6 error: |d| (MODE 1) or d * d (2)) from ax = |x|. d = value - |x|
    is the reference's (signed value) - x up to its sign, which neither error sees: y = x * encode has x's sign or
    is zero, and then the value is 0. CLAMP False leaves out round_e2m1's clamp at 6, for map-to-4: its |y| stays
    below 7 (at most 4 x 1.5, E4M3's largest rounding down, times FP32's own rounding), which rounds onto 6 as
    the clamp would, unless its scale is 0; then map-to-6's is 0 too, both values are 0 (or NaN, from an
    unclamped |y| = Inf), so err4 equals err6 or is NaN, and map-to-6 is kept either way."""
    a = ax * encode
    if CLAMP:
        _, magnitude, _ = round_e2m1(a, 0, 0)
    else:
        offset_bits = tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000)  # round_e2m1's, unclamped
        offset = offset_bits.to(tl.float32, bitcast=True)
        magnitude = tl.fma(offset, -4194304.0, tl.fma(offset, 4194304.0, a))
    bits = magnitude.to(tl.int32, bitcast=True)
    value = tl.where((bits & 0x400000) != 0, v15, v1) * (bits & 0x7F800000).to(tl.float32, bitcast=True)
    d = value - ax
    if MODE == 1:
        e = tl.abs(d)
    else:
        e = d * d
    return magnitude, e


@triton.jit
def _element_error_exact(x, encode, scale, amax, six_b, MODE: tl.constexpr):
    """_element_error's error by the reference's formula, one division an element (any amax)."""
    _, magnitude, negative = round_e2m1(x * encode, 0, 0)
    d = with_sign(tl.div_rn((magnitude * scale) * amax, six_b), negative) - x
    if MODE == 1:
        e = tl.abs(d)
    else:
        e = d * d
    return e


@triton.jit
def _element_errors(xs, encode6, scale6, encode4, scale4, amax, six_bound, inv_six_bound, MODE: tl.constexpr):
    """Both candidates' E2M1 magnitudes and element errors (four tuples of 16: mags6, es6, mags4, es4) of the tiles
    xs (16 columns; encode, scale [R, NB] or [1, NB]; amax [R, 1] or a scalar)."""
    v6, v6h = _error_values(scale6, amax, six_bound, inv_six_bound)
    v4, v4h = _error_values(scale4, amax, six_bound, inv_six_bound)
    mags6 = ()
    es6 = ()
    mags4 = ()
    es4 = ()
    for i in tl.static_range(16):
        ax = tl.abs(xs[i])
        m, e = _element_error(ax, encode6, v6, v6h, MODE, True)
        mags6 = mags6 + (m,)
        es6 = es6 + (e,)
        m, e = _element_error(ax, encode4, v4, v4h, MODE, False)
        mags4 = mags4 + (m,)
        es4 = es4 + (e,)
    return mags6, es6, mags4, es4


@triton.jit
def _sum16(es):
    """es[0] + es[1] + ... + es[15], in that order (TE's element order)."""
    total = es[0]
    for i in tl.static_range(1, 16):
        total = total + es[i]
    return total


@triton.jit
def _block_errors(xs, encode6, scale6, encode4, scale4, amax, six_bound, inv_six_bound, MODE: tl.constexpr):
    """Both candidates' 4over6 errors of each block (xs: the 16 columns; encode, scale [R, NB]; amax [R, 1] or a
    scalar), each element's summed in TE's order, and their E2M1 magnitudes: (err6, err4, mags6, mags4)."""
    mags6, es6, mags4, es4 = _element_errors(xs, encode6, scale6, encode4, scale4, amax, six_bound, inv_six_bound,
                                             MODE)
    return _sum16(es6), _sum16(es4), mags6, mags4


@triton.jit
def _load_column(x_ptr, r, blk, rows, cols, i):
    """Element i of blocks ``blk`` of rows ``r`` [R, NB], in FP32 (the rare exact path's strided re-read)."""
    mask = (r[:, None] < rows) & (blk[None, :] < cols // 16)
    return to_fp32(tl.load(x_ptr + (r[:, None].to(tl.int64) * cols + blk[None, :] * 16 + i), mask=mask, other=0.0))


@triton.jit
def _block_errors_exact(x_ptr, r, blk, rows, cols, encode6, scale6, encode4, scale4, amax, six_bound,
                        MODE: tl.constexpr):
    """_block_errors' (err6, err4) by the reference's formula: loops, not unrolled (rarely run), over the candidates
    and the elements, which re-read x."""
    six_b = tl.zeros(encode6.shape, tl.float32) + six_bound
    err6 = tl.zeros(encode6.shape, tl.float32)
    err = tl.zeros(encode6.shape, tl.float32)
    for j in range(32):  # map-to-6's elements, then map-to-4's: one candidate's code in the loop
        four = j >= 16
        err6 = tl.where(j == 16, err, err6)
        err = tl.where(j == 16, 0.0, err)
        x = _load_column(x_ptr, r, blk, rows, cols, j % 16)
        err = err + _element_error_exact(x, tl.where(four, encode4, encode6), tl.where(four, scale4, scale6), amax,
                                         six_b, MODE)
    return err6, err


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
def _abs_max16(xs):
    """max |xs[i]| over the 16 columns, NaN-propagating (a NaN gives a NaN, as torch.amax; any NaN: the tensor's
    amax is NaN too, and so is every scale), one max.NaN with |.| an element."""
    m = tl.abs(xs[0])
    for i in tl.static_range(1, 16):
        m = tl.maximum(m, tl.abs(xs[i]), propagate_nan=tl.PropagateNan.ALL)
    return m


@triton.jit
def _tile_tree(err, NB: tl.constexpr):
    """[16, NB] row errors of 16x16 tiles -> the tile sums [1, NB]: rows i + i+8, then +4, +2, +1."""
    a, b = tl.split(tl.permute(tl.reshape(err, (2, 8, NB)), (1, 2, 0)))
    a, b = tl.split(tl.permute(tl.reshape(a + b, (2, 4, NB)), (1, 2, 0)))
    a, b = tl.split(tl.permute(tl.reshape(a + b, (2, 2, NB)), (1, 2, 0)))
    a, b = tl.split(tl.permute(tl.reshape(a + b, (2, 1, NB)), (1, 2, 0)))
    return a + b


@triton.jit
def _chosen(pick4, t4, t6):
    """A tuple of the chosen candidate's per-element tensors: t4[i] where pick4, else t6[i]."""
    t = ()
    for i in tl.static_range(len(t6)):
        t = t + (tl.where(pick4, t4[i], t6[i]),)
    return t


@triton.jit(do_not_specialize=["rows"])
def _nvfp4_te_kernel(
    x_ptr, amax_ptr, s_dec_ptr,  # x [rows, cols]; FP32 amax per row (ROW_SCALED) or per tensor; s_dec out
    codes_ptr, scales_ptr, values_ptr,
    rows, cols,
    six_bound, inv_six_bound,  # 6 B and fl(1 / (6 B)) in FP32
    MODE: tl.constexpr,  # 0: no 4over6 (row-scaled standard NVFP4), 1: MAE, 2: MSE
    ROW_SCALED: tl.constexpr, TILE_ROWS: tl.constexpr, DENSE: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_C // 16
    pid_c = tl.program_id(1)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    blk = pid_c * NB + tl.arange(0, NB)
    xs = _load_columns(x_ptr, r, blk, rows, cols, BLOCK_R, NB, CHUNK)  # exact FP32

    # The global scales (nvfp4.global_encode_scale_te): amax 0 gives FLT_MAX, not 1. One program column stores
    # the rows' s_dec; a per-tensor scale only the first program.
    if ROW_SCALED:
        row_ok = r < rows
        amax = tl.load(amax_ptr + r, mask=row_ok, other=0.0)
        s_enc, s_dec = _bounded_global_scales(amax, six_bound)
        tl.store(s_dec_ptr + r, s_dec, mask=row_ok & (pid_c == 0))
        exact = tl.max(_needs_exact_values(amax).to(tl.int32), axis=0) != 0
        amax, s_enc, s_dec = amax[:, None], s_enc[:, None], s_dec[:, None]
    else:
        amax = tl.load(amax_ptr)
        s_enc, s_dec = _bounded_global_scales(amax, six_bound)
        if (tl.program_id(0) == 0) & (pid_c == 0):
            tl.store(s_dec_ptr, s_dec)
        exact = _needs_exact_values(amax)

    amax_b = _abs_max16(xs)
    if TILE_ROWS == 16:
        block_bits = amax_b.to(tl.int32, bitcast=True)
        tile_bits = tl.max(tl.reshape(block_bits, (BLOCK_R // 16, 16, NB)), axis=1)
        block_bits = tl.reshape(tl.broadcast_to(tile_bits[:, None, :], (BLOCK_R // 16, 16, NB)), (BLOCK_R, NB))
        amax_b = block_bits.to(tl.float32, bitcast=True)

    if MODE == 0:  # row-scaled standard NVFP4: the folded multiplier, per row
        one_sixth = tl.full(amax_b.shape, _ONE_SIXTH_BITS, tl.int32).to(tl.float32, bitcast=True)
        scale_bits, scale, encode = block_scales(amax_b, s_dec, s_enc * one_sixth)
        mags = ()
        for i in tl.static_range(16):
            _, magnitude, _ = round_e2m1(xs[i] * encode, 0, 0)
            mags = mags + (magnitude,)
    else:
        bits6, scale6, encode6, bits4, scale4, encode4 = _four_over_six_candidates(amax_b, s_enc, s_dec)
        err6, err4, mags6, mags4 = _block_errors(xs, encode6, scale6, encode4, scale4, amax, six_bound,
                                                 inv_six_bound, MODE)
        if exact:
            err6, err4 = _block_errors_exact(x_ptr, r, blk, rows, cols, encode6, scale6, encode4, scale4, amax,
                                             six_bound, MODE)
        if TILE_ROWS == 16:
            pick4 = tl.broadcast_to(_tile_tree(err4, NB) < _tile_tree(err6, NB), (BLOCK_R, NB))
        else:
            pick4 = err4 < err6  # strict: ties and NaN keep map-to-6
        scale_bits = tl.where(pick4, bits4, bits6)
        scale = tl.where(pick4, scale4, scale6)
        encode = tl.where(pick4, encode4, encode6)
        mags = _chosen(pick4, mags4, mags6)

    _store_rows(xs, mags, encode, scale, scale_bits, r, blk, rows, cols, codes_ptr, scales_ptr, values_ptr, DENSE,
                BLOCK_R, NB)


@triton.jit
def _e2m1_index(magnitude):
    """The E2M1 index 0..7 of an E2M1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6): (bits >> 22) - 252 from 1 up;
    bit 24 (set in 0.5 .. 1.5's words, not in 0's or from 2 up) gives 0.5 its 1 and 0 its 0."""
    bits = magnitude.to(tl.int32, bitcast=True)
    return tl.maximum((bits >> 22) - 252, (bits >> 24) & 1)


@triton.jit
def _store_rows(xs, mags, encode, scale, scale_bits, r, blk, rows, cols, codes_ptr, scales_ptr, values_ptr,
                DENSE: tl.constexpr, BLOCK_R: tl.constexpr, NB: tl.constexpr):
    """The TE kernels' row-wise tail: the 16 columns ``xs`` of blocks ``blk`` of rows ``r`` of [rows, cols], their
    E2M1 magnitudes ``mags`` under their chosen encode / scale ([BLOCK_R, NB]), stored as dense values or as
    packed codes + scale bytes. The sign is y's (y = x * encode), as round_e2m1's."""
    mask = (r[:, None] < rows) & (blk[None, :] < cols // 16)
    row_offs = r[:, None].to(tl.int64) * cols + blk[None, :] * 16  # the blocks' first elements
    if DENSE:  # e2m1 * fp32(scale), the sign of y (signed_value), 4 columns a vector store
        for k in tl.static_range(4):
            v = ()
            for j in tl.static_range(4):
                v = v + (signed_value(mags[4 * k + j], scale, xs[4 * k + j] * encode),)
            offs = row_offs[:, :, None] + 4 * k + tl.arange(0, 4)[None, None, :]
            store_exact(values_ptr, offs, _join4(v[0], v[1], v[2], v[3], BLOCK_R, NB), mask[:, :, None])
    else:  # packed codes (element 2j in the low nibble, sign in bit 3), 4 bytes a vector store; scale bytes
        scale_is_nan = scale != scale
        for k in tl.static_range(2):
            b = ()
            for j in tl.static_range(4):
                code0 = _e2m1_index(mags[8 * k + 2 * j]) | ((xs[8 * k + 2 * j] * encode < 0).to(tl.int32) << 3)
                code1 = _e2m1_index(mags[8 * k + 2 * j + 1]) | ((xs[8 * k + 2 * j + 1] * encode < 0).to(tl.int32) << 3)
                b = b + (masked_codes(code0 | (code1 << 4), scale_is_nan).to(tl.uint8),)
            offs = (row_offs[:, :, None] // 2) + 4 * k + tl.arange(0, 4)[None, None, :]
            tl.store(codes_ptr + offs, _join4(b[0], b[1], b[2], b[3], BLOCK_R, NB), mask=mask[:, :, None])
        tl.store(scales_ptr + r[:, None].to(tl.int64) * (cols // 16) + blk[None, :], scale_bits.to(tl.uint8),
                 mask=mask)


# ------------------------------------------------------------------------------ a 4over6 weight and its transpose
# nvfp4._tiles_rowcol_core: one program holds a row of 16x16 tiles (16 rows x BLOCK_C columns) as the TE kernel
# does, computes each tile's maximum, candidates and element errors once, sums the errors in both of TE's orders
# (along rows then a tree over rows, for x; along columns then a tree over columns, for x.T) and writes both
# copies, each with its own choice: x's row-wise, x.T's from the same registers, transposed on the way out.
@triton.jit
def _halves(t, H: tl.constexpr, NB: tl.constexpr):
    """[2H, NB] -> (rows 0 .. H - 1, rows H .. 2H - 1), each [H, NB]."""
    return tl.split(tl.permute(tl.reshape(t, (2, H, NB)), (1, 2, 0)))


@triton.jit
def _rows4(t, NB: tl.constexpr):
    a, b = _halves(t, 2, NB)
    a0, a1 = _halves(a, 1, NB)
    b0, b1 = _halves(b, 1, NB)
    return a0, a1, b0, b1


@triton.jit
def _rows16(t, NB: tl.constexpr):
    """[16, NB] -> its 16 rows, each [1, NB], a tuple in row order."""
    a, b = _halves(t, 8, NB)
    a0, a1 = _halves(a, 4, NB)
    b0, b1 = _halves(b, 4, NB)
    return _rows4(a0, NB) + _rows4(a1, NB) + _rows4(b0, NB) + _rows4(b1, NB)


@triton.jit
def _tree16(t):
    """A tuple of 16 [1, NB] sums -> t_i + t_{i+8}, then +4, +2, +1 (_tile_tree's order, over a tuple)."""
    t8 = ()
    for i in tl.static_range(8):
        t8 = t8 + (t[i] + t[i + 8],)
    t4 = ()
    for i in tl.static_range(4):
        t4 = t4 + (t8[i] + t8[i + 4],)
    return (t4[0] + t4[2]) + (t4[1] + t4[3])


@triton.jit
def _join16(v, R: tl.constexpr, NB: tl.constexpr):
    """16 tensors [R, NB] -> [R, NB, 16], element i from v[i]."""
    g0 = _join4(v[0], v[1], v[2], v[3], R, NB)
    g1 = _join4(v[4], v[5], v[6], v[7], R, NB)
    g2 = _join4(v[8], v[9], v[10], v[11], R, NB)
    g3 = _join4(v[12], v[13], v[14], v[15], R, NB)
    t = tl.join(tl.join(g0, g2), tl.join(g1, g3))  # [R, NB, 4, 2, 2]: [..., j, a, b] = g_{2a+b}[..., j]
    return tl.reshape(tl.permute(t, (0, 1, 3, 4, 2)), (R, NB, 16))


@triton.jit
def _tile_errors(es, NB: tl.constexpr):
    """A candidate's 4over6 error of each 16x16 tile of a row of tiles from its element errors ``es`` (16 columns
    [16, NB]), in both of TE's orders, each [1, NB]: (x's: each row's elements in order, then the tree over rows;
    x.T's: each column's elements in order, then the tree over columns)."""
    err = _sum16(es)
    columns = ()
    for i in tl.static_range(16):
        rows = _rows16(es[i], NB)
        column = rows[0]
        for j in tl.static_range(1, 16):
            column = column + rows[j]
        columns = columns + (column,)
    return _tile_tree(err, NB), _tree16(columns)


@triton.jit
def _tile_errors_exact(x_ptr, r, blk, rows, cols, encode6, scale6, encode4, scale4, amax, six_bound,
                       NB: tl.constexpr, MODE: tl.constexpr):
    """_tile_errors of both candidates by the reference's formula, (row6, col6, row4, col4): loops, not unrolled
    (rarely run), over the candidates and the columns, which re-read x; column i's sum is kept in row i of a
    [16, NB] tensor for the tree over columns."""
    six_b = tl.zeros(encode6.shape, tl.float32) + six_bound
    row6 = tl.zeros(encode6.shape, tl.float32)
    col6 = tl.zeros(encode6.shape, tl.float32)
    row4 = tl.zeros(encode6.shape, tl.float32)
    col4 = tl.zeros(encode6.shape, tl.float32)
    for c in range(2):
        four = c == 1
        encode = tl.where(four, encode4, encode6)
        scale = tl.where(four, scale4, scale6)
        err = tl.zeros((16, NB), tl.float32)
        columns = tl.zeros((16, NB), tl.float32)
        for i in range(16):
            e = _element_error_exact(_load_column(x_ptr, r, blk, rows, cols, i), encode, scale, amax, six_b, MODE)
            err = err + e
            e_rows = _rows16(e, NB)
            column = e_rows[0]
            for j in tl.static_range(1, 16):
                column = column + e_rows[j]
            columns = tl.where(tl.arange(0, 16)[:, None] == i, column, columns)
        row = _tile_tree(err, NB)
        col = _tile_tree(columns, NB)
        row6 = tl.where(four, row6, row)
        col6 = tl.where(four, col6, col)
        row4 = tl.where(four, row, row4)
        col4 = tl.where(four, col, col4)
    return row6, col6, row4, col4


@triton.jit
def _nvfp4_4over6_rowcol_kernel(
    x_ptr, amax_ptr, s_dec_ptr,  # x [rows, cols] (rows a multiple of 16); its FP32 amax; s_dec out (0-d)
    codes_ptr, scales_ptr, values_ptr,  # x's copy [rows, cols]
    codes_t_ptr, scales_t_ptr, values_t_ptr,  # x.T's copy [cols, col_width], columns from rows on left alone
    rows, cols, col_width,
    six_bound, inv_six_bound,  # 6 B and fl(1 / (6 B)) in FP32
    MODE: tl.constexpr,  # 1: MAE, 2: MSE
    DENSE: tl.constexpr, CHUNK: tl.constexpr, BLOCK_C: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_C // 16
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * 16 + tl.arange(0, 16)
    blk = pid_c * NB + tl.arange(0, NB)
    xs = _load_columns(x_ptr, r, blk, rows, cols, 16, NB, CHUNK)  # exact FP32

    # the global scales (nvfp4.global_encode_scale_te), as _nvfp4_te_kernel: amax 0 gives FLT_MAX
    amax = tl.load(amax_ptr)
    s_enc, s_dec = _bounded_global_scales(amax, six_bound)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(s_dec_ptr, s_dec)

    block_bits = _abs_max16(xs).to(tl.int32, bitcast=True)
    amax_b = tl.max(block_bits, axis=0)[None, :].to(tl.float32, bitcast=True)  # [1, NB]: the tiles' maxima

    bits6, scale6, encode6, bits4, scale4, encode4 = _four_over_six_candidates(amax_b, s_enc, s_dec)
    mags6, es6, mags4, es4 = _element_errors(xs, encode6, scale6, encode4, scale4, amax, six_bound, inv_six_bound,
                                             MODE)
    row6, col6 = _tile_errors(es6, NB)
    row4, col4 = _tile_errors(es4, NB)
    if _needs_exact_values(amax):
        row6, col6, row4, col4 = _tile_errors_exact(x_ptr, r, blk, rows, cols, encode6, scale6, encode4, scale4, amax,
                                                    six_bound, NB, MODE)

    # x's copy (strict <: ties and NaN keep map-to-6)
    pick4 = row4 < row6
    _store_rows(xs, _chosen(pick4, mags4, mags6), tl.broadcast_to(tl.where(pick4, encode4, encode6), (16, NB)),
                tl.broadcast_to(tl.where(pick4, scale4, scale6), (16, NB)),
                tl.broadcast_to(tl.where(pick4, bits4, bits6), (16, NB)), r, blk, rows, cols, codes_ptr, scales_ptr,
                values_ptr, DENSE, 16, NB)

    # x.T's copy: row blk * 16 + i of it is column i of block blk; its elements r are this program's rows
    pick4 = col4 < col6
    encode = tl.where(pick4, encode4, encode6)
    scale = tl.where(pick4, scale4, scale6)
    mags = _chosen(pick4, mags4, mags6)
    out_row = blk[:, None].to(tl.int64) * 16 + tl.arange(0, 16)[None, :]  # [NB, 16]
    mask_blocks = (blk < cols // 16)[:, None]  # [NB, 1]
    mask = mask_blocks[:, :, None]
    if DENSE:
        v = ()
        for i in tl.static_range(16):
            v = v + (signed_value(mags[i], scale, xs[i] * encode),)
        offs = out_row[:, :, None] * col_width + pid_r * 16 + tl.arange(0, 16)[None, None, :]
        store_exact(values_t_ptr, offs, tl.permute(_join16(v, 16, NB), (1, 2, 0)), mask)
    else:  # packed: elements 2j, 2j + 1 of an x.T row are rows 2j, 2j + 1 here
        scale_is_nan = scale != scale
        b = ()
        for i in tl.static_range(16):
            code = _e2m1_index(mags[i]) | ((xs[i] * encode < 0).to(tl.int32) << 3)
            low, high = tl.split(tl.permute(tl.reshape(code, (8, 2, NB)), (0, 2, 1)))
            b = b + (masked_codes(low | (high << 4), scale_is_nan).to(tl.uint8),)
        offs = out_row[:, :, None] * (col_width // 2) + pid_r * 8 + tl.arange(0, 8)[None, None, :]
        tl.store(codes_t_ptr + offs, tl.permute(_join16(b, 8, NB), (1, 2, 0)), mask=mask)
        bits = tl.broadcast_to(tl.reshape(tl.where(pick4, bits4, bits6), (NB,))[:, None], (NB, 16))
        tl.store(scales_t_ptr + out_row * (col_width // 16) + pid_r, bits.to(tl.uint8), mask=mask_blocks)


def _six_bound_args(scale_bound: int) -> tuple[float, float]:
    """(6 B, fl(1 / (6 B))) as FP32 values, the error formula's divisor and its rounded reciprocal."""
    six_b = torch.tensor(6.0 * scale_bound, dtype=torch.float32)
    return float(six_b), float(torch.div(torch.ones((), dtype=torch.float32), six_b))


def quantize_tiles_rowcol(x: torch.Tensor, four_over_six: str, scale_bound: int, *, dense: bool,
                          out_dtype: torch.dtype, col_width: int):
    """nvfp4.quantize_tiles_rowcol on the GPU for x [rows, cols] already padded (both multiples of 16; arguments
    checked by the caller): ((x's outputs), (x.T's, its K zero-padded to col_width)), each as ``quantize_te``
    returns them (codes, scales, amax, s_dec) or dense (values, amax, s_dec). One amax pass, one kernel."""
    x = x.contiguous()
    rows, cols = x.shape
    amax = abs_max(x)
    s_dec = torch.empty((), dtype=torch.float32, device=x.device)
    codes, scales, values = e2m1_outputs((rows, cols), 16, dense, out_dtype, x.device, unused=amax)
    codes_t, scales_t, values_t = e2m1_outputs((cols, col_width), 16, dense, out_dtype, x.device, unused=amax)
    if col_width > rows:  # the K padding of x.T's copy: zero codes, scales and values (what zeros quantize to)
        for t in (values_t,) if dense else (codes_t, scales_t):
            t[:, rows * t.shape[1] // col_width:].zero_()
    grid = (rows // 16, triton.cdiv(cols, BLOCK_COLS))
    _nvfp4_4over6_rowcol_kernel[grid](
        x, amax, s_dec, codes, scales, values, codes_t, scales_t, values_t, rows, cols, col_width,
        *_six_bound_args(scale_bound), MODE={"mae": 1, "mse": 2}[four_over_six], DENSE=dense,
        CHUNK=8 if x.element_size() == 2 else 4, BLOCK_C=BLOCK_COLS, **launch_options(x),
    )
    if dense:
        return (values, amax, s_dec), (values_t, amax.clone(), s_dec.clone())
    return (codes, scales, amax, s_dec), (codes_t, scales_t, amax.clone(), s_dec.clone())


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
        x, amax, s_dec, codes, scales, values, rows, cols, *_six_bound_args(scale_bound),
        MODE={None: 0, "mae": 1, "mse": 2}[four_over_six], ROW_SCALED=row_scaled, TILE_ROWS=tile_rows, DENSE=dense,
        CHUNK=8 if x.element_size() == 2 else 4, BLOCK_R=BLOCK_ROWS,
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

