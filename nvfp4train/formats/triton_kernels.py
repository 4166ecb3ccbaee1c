"""Fused Triton quantizers: the same bits as the PyTorch reference functions, one read of the input.

Each kernel mirrors its reference (``nvfp4._quantize_core``, ``e2m1.round_signed_``) step by step;
the comments name the reference line a step mirrors. Rules that keep the bits identical on a GPU:

* every division is ``tl.div_rn`` (Triton lowers ``/`` on FP32 to an approximate division);
* kernels are launched with ``enable_fp_fusion=False``, so no multiply and add fuse into an FMA
  (the reference rounds each product);
* the casts to E4M3 and E2M1 are integer bit arithmetic (round to nearest even, NaN -> 0x7F), not
  Triton's float8 conversion, whose saturation and NaN rules differ across backends;
* maxima are taken over the integer bits of |x|: for non-negative floats integer order is float
  order, and a NaN's bits exceed +Inf's, so a NaN anywhere gives a NaN amax, as ``torch.amax``.

The global amax is a first pass (``abs_max``: per-program partial maxima, then ``torch.amax`` of
those); it stays a device tensor the quantizing kernel loads (no host sync).

CPU tensors run in Triton's interpreter, which needs ``TRITON_INTERPRET=1`` in the environment
before ``triton`` is first imported (``@triton.jit`` decides at import time, also for
``triton.language``'s own functions). Callers pick this module through ``impl`` (see ``impl.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

from . import hadamard

# Whether this module's kernels were decorated for the interpreter (CPU tensors) or for the GPU.
INTERPRETED = bool(knobs.runtime.interpret)

# Globals a kernel reads must be tl.constexpr (Triton refuses other globals when compiling).
_FLT_MAX = tl.constexpr(3.4028234663852886e38)
_ONE_SIXTH_BITS = tl.constexpr(0x3E2AAAAB)  # fp32(1/6) = torch.reciprocal(torch.tensor(6.0)), as the reference
_SR_DROPPED_BITS = tl.constexpr((1 << 21) - 1)  # e2m1._SR_DROPPED_BITS: the bits below the E2M1 step
_SR_SHIFT = tl.constexpr(13)  # e2m1._SR_SHIFT: a random byte lands on the top 8 of the 21 dropped bits

# Rounding modes as the kernels' constexpr.
RNE, SR_BITS, SR_PHILOX = 0, 1, 2

# Tile of one program: 16 rows (a 16x16 tile's height) x 256 columns (16 scale blocks).
BLOCK_ROWS, BLOCK_COLS = 16, 256
AMAX_BLOCK = 8192


def _launch_options(x: torch.Tensor) -> dict:
    # The interpreter takes no compile options.
    return {} if not x.is_cuda else {"enable_fp_fusion": False, "num_warps": 4}


# ------------------------------------------------------------------------------ global amax
@triton.jit
def _abs_max_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = _to_fp32(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    tl.store(partial_ptr + tl.program_id(0), tl.max(magnitude_bits, axis=0))


def abs_max(x: torch.Tensor) -> torch.Tensor:
    """0-d FP32 max|x| on x's device (NaN if any element is NaN), without a host sync."""
    n = x.numel()
    programs = triton.cdiv(n, AMAX_BLOCK)
    partial = torch.empty(programs, dtype=torch.int32, device=x.device)
    _abs_max_kernel[(programs,)](x, partial, n, BLOCK=AMAX_BLOCK, **_launch_options(x))
    return partial.amax().view(torch.float32)


# ------------------------------------------------------------------------------ shared steps
@triton.jit
def _global_scales(amax):
    """(s_enc, s_dec, s_enc * fp32(1/6)) from the FP32 amax: nvfp4.global_encode_scale and the
    two lines after it in nvfp4._quantize_core."""
    s_enc = tl.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax)  # 6 * 448 / amax, one rounding
    s_enc = tl.where(s_enc > _FLT_MAX, _FLT_MAX, s_enc)  # clamp(max=FLT_MAX); NaN stays NaN
    s_enc = tl.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    s_enc = tl.where(amax <= _FLT_MAX, s_enc, float("nan"))  # amax Inf or NaN -> NaN
    s_dec = tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    one_sixth = tl.full(amax.shape, _ONE_SIXTH_BITS, tl.int32).to(tl.float32, bitcast=True)
    return s_enc, s_dec, s_enc * one_sixth


@triton.jit
def _e4m3_rne(s):
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
def _e2m1_magnitude(index):
    """Index 0..7 -> E2M1 magnitude (FP32): 0 and 0.5 below index 2, else the FP32 word with biased
    exponent and one mantissa bit (index + 252) << 22 (1, 1.5, 2, 3, 4, 6)."""
    return tl.where(index >= 2, ((index + 252) << 22).to(tl.float32, bitcast=True), index.to(tl.float32) * 0.5)


@triton.jit
def _round_e2m1(y, random_bits, ROUNDING: tl.constexpr):
    """e2m1.round_signed_ on FP32 y: (index 0..7 of the rounded magnitude, that magnitude in FP32,
    negative). Codes take the index, dense values the magnitude: a kernel computes only what it uses
    (the compiler drops the other). NaN gives index 0 (e2m1.encode_values maps NaN to code 0) and a NaN
    magnitude (its block's scale is NaN too, so its value is NaN either way). ``negative`` is y < 0
    (the reference's ``y + 0.0`` makes -0 positive), so a negative value that rounds to 0 keeps its sign
    bit (code 0x8), as in TE. SR (ROUNDING != 0) uses the low 8 bits of each of ``random_bits`` (int32,
    y's shape).

    Both roundings are the reference's own FP32 addition, read off the bits. offset = max(2^floor(log2
    |y|), 1) = 2^k (an integer max of the bits: the same order for non-negative floats); the E2M1 grid
    step is offset / 2 there, and index m + 2k is m steps above offset (m = 0..4; k = 0 below 2, where
    the grid starts at 0; m = 4 is the next binade's first point)."""
    negative = y < 0
    a = tl.abs(y)
    a = tl.minimum(a, 6.0, propagate_nan=tl.PropagateNan.ALL)  # clamp_(-6, 6); NaN stays NaN (one min.NaN)
    offset_bits = tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000)
    if ROUNDING != 0:
        # z = |y| + 2 offset (one FP32 rounding, to 2^-21 of a step) lies in [2, 4) offset; the random
        # byte (the low 8 bits of random_bits) is added to the top 8 of the 21 bits below the step and
        # those are cleared: z' = 2 offset + m offset / 2. z' >> 21 is its biased exponent and top 2
        # mantissa bits, 4 (128 + k) + m, and offset_bits >> 22 = 2 (127 + k): the index is
        # (z_bits >> 21) - (offset_bits >> 22) - 258.
        two_offset = offset_bits.to(tl.float32, bitcast=True) * 2.0
        z_bits = (a + two_offset).to(tl.int32, bitcast=True) + ((random_bits & 0xFF) << _SR_SHIFT)
        index = (z_bits - (offset_bits >> 1) - (258 << 21)) >> 21
        magnitude = (z_bits & ~_SR_DROPPED_BITS).to(tl.float32, bitcast=True) - two_offset
        # A GPU's NaN is 0x7FFFFFFF: the byte added to it carries into the sign, leaving a finite word.
        magnitude = tl.where(a != a, a, magnitude)
    else:
        # z = |y| + 2^22 offset lies in [2^22, 2^23) offset, where FP32's spacing is offset / 2: the
        # addition rounds |y| onto the grid, half to even on the step count m (ties to the even code,
        # TE's decision table), and z's word is 2^22 offset's plus m. z - 2^22 offset is exact.
        base_bits = offset_bits + (22 << 23)
        z = a + base_bits.to(tl.float32, bitcast=True)
        index = z.to(tl.int32, bitcast=True) - base_bits + ((offset_bits >> 22) - 254)
        magnitude = z - base_bits.to(tl.float32, bitcast=True)
    return tl.where(a != a, 0, index), magnitude, negative


# bf16 <-> FP32 by bit arithmetic: Triton's interpreter converts bf16 with its own float code,
# which truncates FP32 -> bf16 (its "rtne" mode does not carry either) and mangles subnormals both
# ways; the GPU converts correctly. The bit forms below give both the same bits.
@triton.jit
def _to_fp32(x):
    """A loaded tensor (bf16, fp16 or fp32) widened to FP32 exactly."""
    if x.dtype == tl.bfloat16:
        return ((x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _bf16_rne_bits(v):
    """FP32 v rounded to bf16 to nearest even (NaN stays NaN, overflow gives Inf), as the FP32 word
    with its low 16 bits clear."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536 = 0xFFFF0000
    nan_bits = v.to(tl.int32, bitcast=True) | 0x400000  # a NaN's payload could carry out: keep it, quiet
    return tl.where(v != v, nan_bits & -65536, bits)


@triton.jit
def _round_to(v, DTYPE: tl.constexpr, HW_BF16: tl.constexpr = False):
    """FP32 v rounded to DTYPE and widened back to FP32 (torch's ``.to(dtype).float()``). HW_BF16
    (CUDA sm_80+, ``_hw_bf16``): bf16 by the GPU's own round-to-nearest-even conversion, 2 instructions
    where the bit arithmetic takes 8; the same values, a NaN coming back as the canonical NaN instead of
    with its payload (every consumer treats NaN alike)."""
    if DTYPE == tl.bfloat16:
        if HW_BF16:
            return v.to(tl.bfloat16).to(tl.float32)
        return _bf16_rne_bits(v).to(tl.float32, bitcast=True)
    else:
        return v.to(DTYPE).to(tl.float32)


def _hw_bf16(x: torch.Tensor) -> bool:
    """Whether kernels round FP32 to bf16 with the GPU's conversion (CUDA sm_80+: cvt.rn.bf16.f32; never in
    the interpreter, whose bf16 conversion truncates)."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 0)


@triton.jit
def _store_as(ptr, offs, v, mask):
    """Store FP32 v into ``ptr``'s dtype, rounding to nearest even as torch's ``.to(dtype)``."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = (_bf16_rne_bits(v) >> 16).to(tl.int16)
        tl.store(ptr.to(tl.pointer_type(tl.int16)) + offs, bits, mask=mask)
    else:
        tl.store(ptr + offs, v.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_exact(ptr, offs, v, mask):
    """_store_as for FP32 v that ptr's dtype holds exactly or that overflows FP32 too (E2M1 values times
    an E4M3 or E8M0 block scale: at most 6 significant bits, within bf16's exponent range): a bf16
    store keeps the word's high half, the rounding _store_as would do changing nothing (NaN too: an
    arithmetic NaN is quiet already)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
        tl.store(ptr.to(tl.pointer_type(tl.int16)) + offs, bits, mask=mask)
    else:
        _store_as(ptr, offs, v, mask)


@triton.jit
def _with_sign(magnitude, negative):
    """-magnitude where negative, by the sign bit: Triton's unary minus is 0 - x, which would turn
    the reference's -0.0 (a negative value rounded to zero) into +0.0."""
    bits = magnitude.to(tl.int32, bitcast=True) | (negative.to(tl.int32) << 31)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _philox_bytes(r0, r1, r2, r3):
    """The 16 random bytes of one Philox call (randint4x's words r0..r3, any shape S), as int32 in
    their low 8 bits, shape S + (2, 2, 2, 2): flattened, element k of the 16 takes byte k % 4 (bits
    8 (k % 4) .. + 7) of word k // 4."""
    # join(join(a, c), join(b, d))[.., i, h] = (a, b, c, d)[2 i + h]: four tensors interleaved.
    words = tl.join(tl.join(r0, r2), tl.join(r1, r3)).to(tl.int32, bitcast=True)
    b0, b1, b2, b3 = words & 0xFF, (words >> 8) & 0xFF, (words >> 16) & 0xFF, (words >> 24) & 0xFF
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@triton.jit
def _philox_rows(seed_ptr, first, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """SR's random bytes (int32, low 8 bits) for a [BLOCK_R, BLOCK_C] tile whose element (i, k) has
    the flat output index first[i] + k (first: [BLOCK_R] int64, a multiple of 16; BLOCK_C too).
    One Philox call (randint4x: 4 words) serves 16 elements, 8 bits each, as TE's cvt.rs uses: the
    element of index n takes byte n % 4 of word (n // 4) % 4 of counter n // 16, so its bits depend
    on the index only, not on the tiling (_rht_random_bits draws through it for the Wgrad kernels'
    transposed tiles: the bytes of the materialized operand)."""
    tl.static_assert(BLOCK_C % 16 == 0, "Philox SR draws whole 16-element counters")
    counter = (first[:, None] // 16 + tl.arange(0, BLOCK_C // 16)[None, :]).to(tl.int32)
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed_ptr), counter)
    return tl.reshape(_philox_bytes(r0, r1, r2, r3), (BLOCK_R, BLOCK_C))


# ------------------------------------------------------------------------------ NVFP4
@triton.jit
def _nvfp4_kernel(
    x_ptr, amax_ptr, bits_ptr, seed_ptr,  # inputs: x [rows, cols], 0-d amax, SR bits or seed
    codes_ptr, scales_ptr, values_ptr, s_dec_ptr,  # outputs (codes + scales, or values)
    rows, cols,
    TILE_ROWS: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    s_dec = _nvfp4_tile(x_ptr, amax_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr,
                        pid_r * BLOCK_R, pid_c * BLOCK_C, rows, cols, TILE_ROWS, ROUNDING, DENSE, BLOCK_R, BLOCK_C)
    if (pid_r == 0) & (pid_c == 0):
        tl.store(s_dec_ptr, s_dec)


@triton.jit
def _nvfp4_tile(
    x_ptr, amax_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, r0, c0, rows, cols,
    TILE_ROWS: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """nvfp4._quantize_core and _quantize_impl / _fake_quantize_impl for rows r0 .. r0 + BLOCK_R,
    columns c0 .. c0 + BLOCK_C of x [rows, cols]; returns s_dec."""
    NB: tl.constexpr = BLOCK_C // 16
    r = r0 + tl.arange(0, BLOCK_R)
    c = c0 + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r[:, None].to(tl.int64) * cols + c[None, :]
    x = _to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))  # y = x.to(float32): exact

    # block_amax: max over 16 columns, and for a 16x16 tile over its 16 rows, repeated on them.
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    block_bits = tl.max(tl.reshape(magnitude_bits, (BLOCK_R, NB, 16)), axis=2)
    if TILE_ROWS == 16:
        tile_bits = tl.max(tl.reshape(block_bits, (BLOCK_R // 16, 16, NB)), axis=1)
        block_bits = tl.reshape(tl.broadcast_to(tile_bits[:, None, :], (BLOCK_R // 16, 16, NB)), (BLOCK_R, NB))
    amax_b = block_bits.to(tl.float32, bitcast=True)

    s_enc, s_dec, multiplier = _global_scales(tl.load(amax_ptr))
    # scales = clamp(amax_b * multiplier, max=448).to(e4m3)
    scaled = amax_b * multiplier
    scale_bits, scale = _e4m3_rne(tl.where(scaled > 448.0, 448.0, scaled))
    # block_encode = clamp(reciprocal(fp32(scale) * s_dec), max=FLT_MAX)
    encode = tl.div_rn(tl.full((BLOCK_R, NB), 1.0, tl.float32), scale * s_dec)
    encode = tl.where(encode > _FLT_MAX, _FLT_MAX, encode)
    # y.view(rows, nb, 16).mul_(block_encode)
    y = tl.reshape(tl.reshape(x, (BLOCK_R, NB, 16)) * encode[:, :, None], (BLOCK_R, BLOCK_C))

    if ROUNDING == 1:
        random_bits = tl.load(bits_ptr + offs, mask=mask, other=0)
    elif ROUNDING == 2:
        # Rows start at multiples of 16 (cols is one), as _philox_rows asks.
        random_bits = _philox_rows(seed_ptr, r.to(tl.int64) * cols + c0, BLOCK_R, BLOCK_C)
    else:
        random_bits = 0
    index, grid_magnitude, negative = _round_e2m1(y, random_bits, ROUNDING)

    if DENSE:
        # _fake_quantize_impl: values * fp32(scale_b), exact; NaN scales give NaN.
        magnitude = tl.reshape(tl.reshape(grid_magnitude, (BLOCK_R, NB, 16)) * scale[:, :, None],
                               (BLOCK_R, BLOCK_C))
        values = _with_sign(magnitude, negative)
        _store_exact(values_ptr, offs, values, mask)
    else:
        # e2m1.encode_values + pack: sign in bit 3, element 2j in the low nibble.
        code = index | (negative.to(tl.int32) << 3)
        low, high = tl.split(tl.reshape(code, (BLOCK_R, BLOCK_C // 2, 2)))
        c2 = c0 // 2 + tl.arange(0, BLOCK_C // 2)
        mask2 = (r[:, None] < rows) & (c2[None, :] < cols // 2)
        tl.store(codes_ptr + r[:, None].to(tl.int64) * (cols // 2) + c2[None, :],
                 (low | (high << 4)).to(tl.uint8), mask=mask2)
        cb = c0 // 16 + tl.arange(0, NB)
        maskb = (r[:, None] < rows) & (cb[None, :] < cols // 16)
        tl.store(scales_ptr + r[:, None].to(tl.int64) * (cols // 16) + cb[None, :], scale_bits.to(tl.uint8),
                 mask=maskb)
    return s_dec


def philox_seed(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A 1-element int64 seed for the kernels' Philox stream, drawn on x's device from
    ``generator`` (torch's default for that device when None): no host sync, and the generator
    advances, so successive calls draw different bits."""
    from .rounding import _check_generator_device

    _check_generator_device(x, generator)
    return torch.randint(0, 2**62, (1,), generator=generator, device=x.device, dtype=torch.int64)


def _rounding_args(x, rounding: str, random_bits, generator, seed=None):
    """(ROUNDING constexpr, random-bits tensor, seed tensor); unused ones are x (never read)."""
    if rounding == "rne":
        return RNE, x, x
    if seed is not None:
        return SR_PHILOX, x, seed
    if random_bits is not None:
        if random_bits.numel() != x.numel():
            raise ValueError(f"random_bits has {random_bits.numel()} elements, x has {x.numel()}")
        return SR_BITS, random_bits.contiguous().view(torch.int32), x
    if x.numel() >= 2**31:
        raise ValueError(f"triton SR: Philox offsets are 32-bit; x has {x.numel()} >= 2^31 elements")
    return SR_PHILOX, x, philox_seed(x, generator)


def nvfp4(
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
    mode, bits, seed = _rounding_args(x, rounding, random_bits, generator, seed)
    dummy = amax  # stands for the output pointers the constexpr branches do not touch
    if dense:
        values = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=device)
        codes = scales = dummy
    else:
        codes = torch.empty((*x.shape[:-1], cols // 2), dtype=torch.uint8, device=device)
        scales = torch.empty((*x.shape[:-1], cols // 16), dtype=torch.uint8, device=device)
        values = dummy
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _nvfp4_kernel[grid](
        x, amax, bits, seed, codes, scales, values, s_dec, rows, cols,
        TILE_ROWS=tile_rows, ROUNDING=mode, DENSE=dense, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
        **_launch_options(x),
    )
    if dense:
        return values, amax, s_dec
    return codes, scales, amax, s_dec


# ------------------------------------------------------------------------------ MXFP4
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
    return tl.where(amax_b <= _FLT_MAX, e + 127, 255)  # E8M0_NAN for Inf / NaN


@triton.jit
def _e8m0_scales(amax_b, SCALE_RULE: tl.constexpr):
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
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r[:, None].to(tl.int64) * cols + c[None, :]
    x = _to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))

    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax_b = tl.max(tl.reshape(magnitude_bits, (BLOCK_R, NB, 32)), axis=2).to(tl.float32, bitcast=True)
    scale_bits, scale, inverse = _e8m0_scales(amax_b, SCALE_RULE)
    y = tl.reshape(tl.reshape(x, (BLOCK_R, NB, 32)) * inverse[:, :, None], (BLOCK_R, BLOCK_C))

    if ROUNDING == 1:
        random_bits = tl.load(bits_ptr + offs, mask=mask, other=0)
    elif ROUNDING == 2:
        # Rows start at multiples of 16 (cols is one of 32), as _philox_rows asks.
        random_bits = _philox_rows(seed_ptr, r.to(tl.int64) * cols + pid_c * BLOCK_C, BLOCK_R, BLOCK_C)
    else:
        random_bits = 0
    index, grid_magnitude, negative = _round_e2m1(y, random_bits, ROUNDING)

    if DENSE:
        magnitude = tl.reshape(tl.reshape(grid_magnitude, (BLOCK_R, NB, 32)) * scale[:, :, None],
                               (BLOCK_R, BLOCK_C))
        values = _with_sign(magnitude, negative)
        _store_exact(values_ptr, offs, values, mask)
    else:
        code = index | (negative.to(tl.int32) << 3)
        low, high = tl.split(tl.reshape(code, (BLOCK_R, BLOCK_C // 2, 2)))
        c2 = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
        mask2 = (r[:, None] < rows) & (c2[None, :] < cols // 2)
        tl.store(codes_ptr + r[:, None].to(tl.int64) * (cols // 2) + c2[None, :],
                 (low | (high << 4)).to(tl.uint8), mask=mask2)
        cb = pid_c * NB + tl.arange(0, NB)
        maskb = (r[:, None] < rows) & (cb[None, :] < cols // 32)
        tl.store(scales_ptr + r[:, None].to(tl.int64) * (cols // 32) + cb[None, :], scale_bits.to(tl.uint8),
                 mask=maskb)


def mxfp4(
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
    mode, bits, seed = _rounding_args(x, rounding, random_bits, generator)
    if dense:
        values = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
        codes = scales = values
    else:
        codes = torch.empty((*x.shape[:-1], cols // 2), dtype=torch.uint8, device=x.device)
        scales = torch.empty((*x.shape[:-1], cols // 32), dtype=torch.uint8, device=x.device)
        values = codes
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _mxfp4_kernel[grid](
        x, bits, seed, codes, scales, values, rows, cols,
        SCALE_RULE={"rceil": 0, "floor": 1}[scale_rule], ROUNDING=mode, DENSE=dense,
        BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS, **_launch_options(x),
    )
    return values if dense else (codes, scales)


# ------------------------------------------------------------------------------ Wgrad: RHT + transpose + NVFP4 / MXFP4
# The Wgrad operand of x [tokens, features] is NVFP4 1x16 of hadamard.rht(x.T, 16), or MXFP4 1x32
# of hadamard.rht(x.T, 32): blocks of D consecutive tokens, transformed and quantized together. A
# program reads GROUPS x D tokens x BLOCK_F features of x (row-major, coalesced), transforms each
# D-token group in registers and writes the transposed result, one contiguous run of GROUPS x D
# tokens per feature. NVFP4 takes two passes: the amax of the transformed tensor (TE's post-RHT
# amax), then the quantization. MXFP4 has no tensor scale and takes one. Neither materializes the
# transform.
RHT_GROUPS, RHT_BLOCK_F = 4, 64  # default blocks: groups of D tokens x features per program


def _rht_entry_bits(d: int) -> int:
    """|entry| of hadamard.rht_matrix(d) as FP32 bits (every entry is ±fp32(1/sqrt(d)))."""
    return int(hadamard.rht_matrix(d, torch.ones(d))[0, 0].view(torch.int32))


_RHT16_ENTRY_BITS = tl.constexpr(_rht_entry_bits(16))  # 1/4
_RHT32_ENTRY_BITS = tl.constexpr(_rht_entry_bits(32))  # fp32(1/sqrt(32)): the products round


@triton.jit
def _rht_tokens(x_ptr, t0, f, mask_f, n_features, D: tl.constexpr, ENTRY_BITS: tl.constexpr,
                SIGN_MASK: tl.constexpr, GROUPS: tl.constexpr, BLOCK_F: tl.constexpr, ROUNDED: tl.constexpr = True,
                HW_BF16: tl.constexpr = False):
    """hadamard.rht(., D) along tokens for tokens t0 .. t0 + D GROUPS and features f: FP32
    [GROUPS, D, BLOCK_F], element (g, j, f) = sum_i x[t0 + D g + i, f] * m[i, j], each product
    rounded to FP32 and summed in index order i (hadamard.rht's loop), then rounded to x's dtype
    and back (ROUNDED=False: the FP32 sums, left unrounded; HW_BF16: see _round_to).
    m[i, j] = s_i (-1)^popcount(i & j) |m|, |m| the FP32 with bits ENTRY_BITS and s_i = -1 where
    bit i of SIGN_MASK is set (D <= 256).

    Token i of every group is loaded as a [GROUPS, 1, BLOCK_F] tile: the sum takes that load's
    layout, so one thread holds all D outputs of its (group, feature) and the products need no
    exchange between threads (a [GROUPS, BLOCK_F] load would be re-laid out through shared memory,
    once per token).

    Returns (the transform, the FP32 bits of max|x| over the tile): the second for callers that want
    x's own amax too, from the loads the transform makes (unused, the compiler drops it)."""
    g = tl.arange(0, GROUPS)
    j = tl.arange(0, D)
    rows = (t0 + g * D).to(tl.int64)
    # |m| = 1/4 (D = 16) times a bf16/fp16 value: every product is exact. Not for FP32 inputs (a
    # subnormal product rounds) nor D = 32 (|m| = fp32(1/sqrt(32)) rounds the products).
    EXACT_PRODUCTS: tl.constexpr = (D == 16) and (x_ptr.dtype.element_ty != tl.float32)
    # Token i's pointers are token 0's plus i rows: one 64-bit multiply per element, not one per token.
    first = x_ptr + (rows[:, None, None] * n_features + f[None, None, :])
    for i in tl.static_range(D):
        xi = _to_fp32(tl.load(first + i * n_features, mask=mask_f[None, None, :], other=0.0))
        magnitude_bits = xi.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # max|x| (NaN above Inf), where asked
        x_bits = magnitude_bits if i == 0 else tl.maximum(x_bits, magnitude_bits)
        parity = i & j  # popcount(i & j) mod 2, folding 8 bits
        parity = parity ^ (parity >> 4)
        parity = parity ^ (parity >> 2)
        parity = (parity ^ (parity >> 1)) & 1
        negative = parity ^ ((SIGN_MASK >> i) & 1)
        m_i = ((negative << 31) | ENTRY_BITS).to(tl.float32, bitcast=True)  # row i of rht_matrix(D)
        if i == 0:
            acc = xi * m_i[None, :, None]
        elif EXACT_PRODUCTS:
            # x * (±1/4) is exact for a 16-bit input (no rounding, no FP32 underflow), so the fused
            # multiply-add rounds once, as the product-then-sum does: one instruction, not two.
            acc = tl.fma(xi, m_i[None, :, None], acc)
        else:
            acc = acc + xi * m_i[None, :, None]
    y = _round_to(acc, x_ptr.dtype.element_ty, HW_BF16) if ROUNDED else acc
    return y, tl.max(tl.max(tl.max(x_bits, axis=2), axis=1), axis=0)


@triton.jit
def _output_offsets(f, row_len, first, N: tl.constexpr):
    """[BLOCK_F, N] offsets of elements first .. first + N of rows f of a row-major output."""
    return f[:, None].to(tl.int64) * row_len + first + tl.arange(0, N)[None, :]


@triton.jit
def _to_output_rows(v, GROUPS: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr):
    """[GROUPS, K, BLOCK_F] (K output elements per group and feature) -> [BLOCK_F, GROUPS K], row f
    the GROUPS K consecutive elements of output row f: stores then write one contiguous run per
    feature (not K elements per group)."""
    return tl.reshape(tl.permute(v, (2, 0, 1)), (BLOCK_F, GROUPS * K))


@triton.jit
def _rht_random_bits(bits_ptr, seed_ptr, f, mask_f, t0, n_tokens, ROUNDING: tl.constexpr, GROUPS: tl.constexpr,
                     D: tl.constexpr, BLOCK_F: tl.constexpr):
    """SR's random bits for the [GROUPS, D, BLOCK_F] tile at tokens t0, indexed in the [features,
    tokens] output: words loaded from ``bits_ptr`` (ROUNDING 1) or Philox bytes from the seed
    (ROUNDING 2; an element's byte depends on its output index only, so these are the bits
    ``mxfp4`` / ``nvfp4`` draw for the materialized operand from the same seed). Row f's first
    index f n_tokens + t0 is a multiple of 16 (n_tokens is one of D, t0 of GROUPS D), as
    _philox_rows asks. Drawn as a [BLOCK_F, GROUPS D] tile and permuted: the compiler relabels the
    registers (the same machine code as drawing the bytes in the [GROUPS, D, BLOCK_F] layout
    directly, scripts/kernel_sass.py, 2026-11)."""
    if ROUNDING == 1:
        words = tl.load(bits_ptr + _output_offsets(f, n_tokens, t0, GROUPS * D), mask=mask_f[:, None], other=0)
    else:
        words = _philox_rows(seed_ptr, f.to(tl.int64) * n_tokens + t0, BLOCK_F, GROUPS * D)
    return tl.permute(tl.reshape(words, (BLOCK_F, GROUPS, D)), (1, 2, 0))


@triton.jit
def _store_e2m1_t(codes_ptr, scales_ptr, index, negative, scale_bits, f, mask_f, t0, n_tokens,
                  GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_F: tl.constexpr):
    """Packed codes [features, tokens / 2] and scale bits [features, tokens / D] of the
    [GROUPS, D, BLOCK_F] tile at tokens t0 (e2m1.encode_values + pack: sign in bit 3, the even
    element of a pair in the low nibble)."""
    code = index | (negative.to(tl.int32) << 3)
    nibble_weight = (1 + 15 * tl.arange(0, 2))[None, None, :, None]
    packed = tl.sum(tl.reshape(code, (GROUPS, D // 2, 2, BLOCK_F)) * nibble_weight, axis=2)  # [GROUPS, D/2, BLOCK_F]
    tl.store(codes_ptr + _output_offsets(f, n_tokens // 2, t0 // 2, GROUPS * D // 2),
             _to_output_rows(packed, GROUPS, D // 2, BLOCK_F).to(tl.uint8), mask=mask_f[:, None])
    tl.store(scales_ptr + _output_offsets(f, n_tokens // D, t0 // D, GROUPS),
             tl.permute(scale_bits, (1, 0)).to(tl.uint8), mask=mask_f[:, None])


@triton.jit
def _round_and_store_t(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, f, mask_f, t0,
                       n_tokens, ROUNDING: tl.constexpr, DENSE: tl.constexpr, GROUPS: tl.constexpr, D: tl.constexpr,
                       BLOCK_F: tl.constexpr):
    """The Wgrad kernels' common tail: y [GROUPS, D, BLOCK_F] already divided by its block scale is
    rounded onto E2M1 (RNE or SR) and stored transposed, as dense values (x scale) or codes + scales."""
    if ROUNDING != 0:
        random_bits = _rht_random_bits(bits_ptr, seed_ptr, f, mask_f, t0, n_tokens, ROUNDING, GROUPS, D, BLOCK_F)
    else:
        random_bits = 0
    index, grid_magnitude, negative = _round_e2m1(y, random_bits, ROUNDING)
    if DENSE:
        values = _with_sign(grid_magnitude * scale[:, None, :], negative)
        _store_exact(values_ptr, _output_offsets(f, n_tokens, t0, GROUPS * D),
                  _to_output_rows(values, GROUPS, D, BLOCK_F), mask_f[:, None])
    else:
        _store_e2m1_t(codes_ptr, scales_ptr, index, negative, scale_bits, f, mask_f, t0, n_tokens, GROUPS, D,
                      BLOCK_F)


@triton.jit
def _rht_abs_max_kernel(x_ptr, partial_ptr, row_partial_ptr, n_features, SIGN_MASK: tl.constexpr,
                        ROWWISE: tl.constexpr, GROUPS: tl.constexpr, BLOCK_F: tl.constexpr):
    """Partial maxima of |rht(x.T, 16)| and, with ROWWISE, of |x| (the same tile, read once).

    The transform's rounding to x's dtype is applied to the tile's maximum only: rounding to nearest
    even is odd-symmetric and monotonic, so max |round(v)| = round(max |v|) (NaN included: its
    magnitude bits are above Inf's either way), one rounding per program instead of one per element."""
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = f < n_features
    y, x_bits = _rht_tokens(x_ptr, pid_t * GROUPS * 16, f, mask_f, n_features, 16, _RHT16_ENTRY_BITS, SIGN_MASK,
                            GROUPS, BLOCK_F, ROUNDED=False)
    bits = tl.max(tl.max(tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2), axis=1), axis=0)
    rounded = _round_to(bits.to(tl.float32, bitcast=True), x_ptr.dtype.element_ty)
    tl.store(partial_ptr + pid_t * tl.num_programs(1) + pid_f, rounded.to(tl.int32, bitcast=True))
    if ROWWISE:  # max|x| of the same tile, from the transform's loads
        tl.store(row_partial_ptr + pid_t * tl.num_programs(1) + pid_f, x_bits)


@triton.jit
def _rht_nvfp4_kernel(
    x_ptr, amax_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, s_dec_ptr,
    row_amax_ptr, row_seed_ptr, row_codes_ptr, row_scales_ptr, row_values_ptr, row_s_dec_ptr,
    n_tokens, n_features,
    SIGN_MASK: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    ROWWISE: tl.constexpr, ROW_DENSE: tl.constexpr, GROUPS: tl.constexpr, BLOCK_F: tl.constexpr, HW_BF16: tl.constexpr,
):
    """_nvfp4_kernel's steps (1x16 tile) on the transformed tile, written transposed: output row
    f, columns t0 + 16 g + j. With ROWWISE, also NVFP4 1x16 of x itself (rows t, blocks along
    features) from the same tile (RNE or Philox SR from its own seed)."""
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    t0 = pid_t * GROUPS * 16
    if ROWWISE:
        row_s_dec = _nvfp4_tile(x_ptr, row_amax_ptr, row_seed_ptr, row_seed_ptr, row_codes_ptr, row_scales_ptr,
                                row_values_ptr, t0, pid_f * BLOCK_F, n_tokens, n_features, 1, ROUNDING, ROW_DENSE,
                                GROUPS * 16, BLOCK_F)
        if (pid_t == 0) & (pid_f == 0):
            tl.store(row_s_dec_ptr, row_s_dec)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = f < n_features
    y, _ = _rht_tokens(x_ptr, t0, f, mask_f, n_features, 16, _RHT16_ENTRY_BITS, SIGN_MASK, GROUPS,
                       BLOCK_F, HW_BF16=HW_BF16)  # [GROUPS, 16, BLOCK_F]

    amax_b = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1).to(tl.float32, bitcast=True)
    s_enc, s_dec, multiplier = _global_scales(tl.load(amax_ptr))
    scaled = amax_b * multiplier
    scale_bits, scale = _e4m3_rne(tl.where(scaled > 448.0, 448.0, scaled))  # [GROUPS, BLOCK_F]
    encode = tl.div_rn(tl.full((GROUPS, BLOCK_F), 1.0, tl.float32), scale * s_dec)
    encode = tl.where(encode > _FLT_MAX, _FLT_MAX, encode)
    y = y * encode[:, None, :]

    _round_and_store_t(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, f, mask_f, t0,
                       n_tokens, ROUNDING, DENSE, GROUPS, 16, BLOCK_F)
    if (pid_t == 0) & (pid_f == 0):
        tl.store(s_dec_ptr, s_dec)


@triton.jit
def _rht_mxfp4_kernel(
    x_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, n_tokens, n_features,
    SIGN_MASK: tl.constexpr, SCALE_RULE: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    GROUPS: tl.constexpr, BLOCK_F: tl.constexpr, HW_BF16: tl.constexpr,
):
    """_mxfp4_kernel's steps on hadamard.rht(x.T, 32) of a tile of GROUPS x 32 tokens x BLOCK_F
    features, written transposed: output row f, columns t0 + 32 g + j. One pass: no tensor scale."""
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    t0 = pid_t * GROUPS * 32
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = f < n_features
    y, _ = _rht_tokens(x_ptr, t0, f, mask_f, n_features, 32, _RHT32_ENTRY_BITS, SIGN_MASK, GROUPS,
                       BLOCK_F, HW_BF16=HW_BF16)  # [GROUPS, 32, BLOCK_F]

    amax_b = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1).to(tl.float32, bitcast=True)
    scale_bits, scale, inverse = _e8m0_scales(amax_b, SCALE_RULE)  # [GROUPS, BLOCK_F]
    y = y * inverse[:, None, :]

    _round_and_store_t(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, f, mask_f, t0,
                       n_tokens, ROUNDING, DENSE, GROUPS, 32, BLOCK_F)


def sign_mask(signs: torch.Tensor) -> int:
    """The d ±1 signs (hadamard.resolve_signs) as a bit mask: bit i set where sign i is -1 (a
    compile-time constant of the kernels: no sign tensor to copy to the device)."""
    return sum(1 << i for i, s in enumerate(signs.tolist()) if s < 0)


def _rht_launch_options(x: torch.Tensor, warps: int) -> dict:
    options = _launch_options(x)
    if x.is_cuda:
        options["num_warps"] = warps
    return options


def rht_blocks(n_tokens: int, d: int, blocks=None) -> tuple[int, int, int]:
    """(groups of d tokens, features, warps) of a program of the RHT kernels: ``blocks`` is
    (groups, features) or (groups, features, warps), default (RHT_GROUPS, RHT_BLOCK_F); all powers
    of two, groups halved until it divides n_tokens / d (tokens are not masked). Default warps: one
    per 64 (group, feature) pairs (1 to 8), so a thread holds 2 features of a group, D accumulators
    each, whatever the block shape; more warps spread the same tile thinner (fewer registers a
    thread, more programs resident on an SM). A speed knob only: the bits do not depend on it."""
    if blocks is not None and len(blocks) not in (2, 3):
        raise ValueError(f"rht blocks={blocks!r}: (groups, features) or (groups, features, warps)")
    groups, block_f, *warps = blocks if blocks is not None else (RHT_GROUPS, RHT_BLOCK_F)
    if not all(isinstance(v, int) and v >= 1 and v & (v - 1) == 0 for v in (groups, block_f, *warps)):
        raise ValueError(f"rht blocks={blocks!r}: (groups of {d} tokens, features[, warps]) per program must be "
                         f"powers of two")
    while n_tokens % (groups * d):
        groups //= 2
    return groups, block_f, warps[0] if warps else min(8, max(1, groups * block_f // 64))


def rht_nvfp4_t(
    x: torch.Tensor,
    signs: torch.Tensor,
    rounding: str,
    *,
    dense: bool,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    out_dtype: torch.dtype | None = None,
    rowwise: bool = False,
    rowwise_dense: bool = False,
    seeds: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
):
    """NVFP4 1x16 of hadamard.rht(x.T, 16, signs) for x [tokens, features] (tokens % 16 == 0,
    checked by the caller). Outputs as ``nvfp4`` for the [features, tokens] result; SR bits are
    indexed in that layout (``random_bits`` [features, tokens]). ``blocks``: see ``rht_blocks``.

    rowwise=True also quantizes x itself (NVFP4 1x16 along features, as ``nvfp4(x, 1, ...)``) from
    the same reads and returns ``(rowwise outputs, columnwise outputs)``; SR then draws Philox bits
    only, from two seeds (``seeds``: int64 [2], columnwise and rowwise; default drawn from
    ``generator``)."""
    x = x.contiguous()
    n_tokens, n_features = x.shape
    mask = sign_mask(signs)
    groups, block_f, warps = rht_blocks(n_tokens, 16, blocks)
    grid = (n_tokens // (groups * 16), triton.cdiv(n_features, block_f))
    partial = torch.empty((2 if rowwise else 1, grid[0] * grid[1]), dtype=torch.int32, device=x.device)
    _rht_abs_max_kernel[grid](x, partial[0], partial[-1], n_features, SIGN_MASK=mask, ROWWISE=rowwise, GROUPS=groups,
                              BLOCK_F=block_f, **_rht_launch_options(x, warps))
    amaxes = partial.amax(dim=1).view(torch.float32)
    amax, row_amax = amaxes[0], amaxes[-1]
    if rowwise and rounding == "sr":
        if random_bits is not None:
            raise ValueError("rht_nvfp4_t: rowwise=True draws Philox bits; random_bits is not supported with it")
        if seeds is None:
            seeds = torch.cat([philox_seed(x, generator), philox_seed(x, generator)])
        mode, bits, seed, row_seed = SR_PHILOX, x, seeds[0:1], seeds[1:2]
    elif seeds is not None and rounding == "sr":
        mode, bits, seed, row_seed = SR_PHILOX, x, seeds[0:1], x
    else:
        (mode, bits, seed), row_seed = _rounding_args(x, rounding, random_bits, generator), x
    outputs = []
    for is_dense, (rows, cols) in ((dense, (n_features, n_tokens)), (rowwise_dense, (n_tokens, n_features))):
        s_dec = torch.empty((), dtype=torch.float32, device=x.device)
        if is_dense:
            values = torch.empty((rows, cols), dtype=out_dtype or x.dtype, device=x.device)
            outputs.append((values, values, values, s_dec))
        else:
            codes = torch.empty((rows, cols // 2), dtype=torch.uint8, device=x.device)
            scales = torch.empty((rows, cols // 16), dtype=torch.uint8, device=x.device)
            outputs.append((codes, scales, codes, s_dec))
    (codes, scales, values, s_dec), (row_codes, row_scales, row_values, row_s_dec) = outputs
    _rht_nvfp4_kernel[grid](
        x, amax, bits, seed, codes, scales, values, s_dec,
        row_amax, row_seed, row_codes, row_scales, row_values, row_s_dec, n_tokens, n_features,
        SIGN_MASK=mask, ROUNDING=mode, DENSE=dense, ROWWISE=rowwise, ROW_DENSE=rowwise_dense, GROUPS=groups,
        BLOCK_F=block_f, HW_BF16=_hw_bf16(x), **_rht_launch_options(x, warps),
    )
    columnwise = (values, amax, s_dec) if dense else (codes, scales, amax, s_dec)
    if not rowwise:
        return columnwise
    row = (row_values, row_amax, row_s_dec) if rowwise_dense else (row_codes, row_scales, row_amax, row_s_dec)
    return row, columnwise


def rht_mxfp4_t(
    x: torch.Tensor,
    signs: torch.Tensor,
    scale_rule: str,
    rounding: str,
    *,
    dense: bool,
    random_bits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    out_dtype: torch.dtype | None = None,
    seed: torch.Tensor | None = None,
    blocks: tuple[int, ...] | None = None,
):
    """MXFP4 1x32 of hadamard.rht(x.T, 32, signs) for x [tokens, features] (tokens % 32 == 0,
    checked by the caller; ``scale_rule`` canonical). Outputs as ``mxfp4`` for the [features,
    tokens] result: (codes, scale bits), or with dense=True the values in out_dtype. SR bits are
    indexed in that layout (``random_bits`` [features, tokens]), else Philox from ``seed`` or a
    seed drawn from ``generator``. ``blocks``: see ``rht_blocks``."""
    x = x.contiguous()
    n_tokens, n_features = x.shape
    groups, block_f, warps = rht_blocks(n_tokens, 32, blocks)
    mode, bits, seed = _rounding_args(x, rounding, random_bits, generator, seed)
    if dense:
        values = torch.empty((n_features, n_tokens), dtype=out_dtype or x.dtype, device=x.device)
        codes = scales = values
    else:
        codes = torch.empty((n_features, n_tokens // 2), dtype=torch.uint8, device=x.device)
        scales = torch.empty((n_features, n_tokens // 32), dtype=torch.uint8, device=x.device)
        values = codes
    grid = (n_tokens // (groups * 32), triton.cdiv(n_features, block_f))
    _rht_mxfp4_kernel[grid](
        x, bits, seed, codes, scales, values, n_tokens, n_features,
        SIGN_MASK=sign_mask(signs), SCALE_RULE={"rceil": 0, "floor": 1}[scale_rule], ROUNDING=mode, DENSE=dense,
        GROUPS=groups, BLOCK_F=block_f, HW_BF16=_hw_bf16(x), **_rht_launch_options(x, warps),
    )
    return values if dense else (codes, scales)


# ------------------------------------------------------------------------------ FP8 blockwise
@triton.jit
def _fp8_rne(v, MANT: tl.constexpr, BIAS: tl.constexpr):
    """FP32 v with |v| <= the format's max (or NaN) -> FP8 bits (int32 0..255), as torch's
    ``.to(float8_e4m3fn / float8_e5m2)``: RNE, subnormals, sign kept (-0.0 -> 0x80), NaN -> 0x7F."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(v)
    a_bits = a.to(tl.int32, bitcast=True)
    SHIFT: tl.constexpr = 23 - MANT
    normal = ((a_bits + ((1 << (SHIFT - 1)) - 1) + ((a_bits >> SHIFT) & 1)) >> SHIFT) - ((127 - BIAS) << MANT)
    # Below the smallest normal 2^(1 - BIAS): a / 2^(1 - BIAS - MANT) rounded to an integer (see _e4m3_rne).
    subnormal = ((a * (2.0 ** (BIAS - 1 + MANT))) + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    code = tl.where(a < 2.0 ** (1 - BIAS), subnormal, normal)
    return tl.where(v != v, 0x7F, code | sign)


@triton.jit
def _fp8_value(code, MANT: tl.constexpr, BIAS: tl.constexpr):
    """FP8 bits (int32) -> FP32 value (``.to(torch.float32)``); 0x7F / 0xFF -> NaN."""
    magnitude = code & 0x7F
    exponent = magnitude >> MANT
    fraction = magnitude & ((1 << MANT) - 1)
    normal = (((exponent + (127 - BIAS)) << 23) | (fraction << (23 - MANT))).to(tl.float32, bitcast=True)
    subnormal = fraction.to(tl.float32) * (2.0 ** (1 - BIAS - MANT))
    value = tl.where(exponent == 0, subnormal, normal)
    value = tl.where(magnitude == 0x7F, float("nan"), value)
    return _with_sign(value, (code & 0x80) != 0)


@triton.jit
def _fp8_block_scales(amax, scale_for_inf, FP8_MAX: tl.constexpr, POW2: tl.constexpr):
    """encode_scale_from_amax for FP32 block maxima (any shape): (encode, decode)."""
    encode = tl.div_rn(tl.full(amax.shape, FP8_MAX, tl.float32), amax)
    encode = tl.where(encode == float("inf"), scale_for_inf, encode)
    encode = tl.where(amax == 0, 1.0, encode)
    if POW2:
        encode = (encode.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)  # always normal
    encode = tl.where(amax <= _FLT_MAX, encode, float("nan"))
    return encode, tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), encode)


@triton.jit
def _fp8_codes(scaled, FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, HW_CVT: tl.constexpr):
    """Clamp to the format's max, then RNE to FP8 bits (int32). HW_CVT (sm_89+): the GPU's own conversion
    (cvt.rn.satfinite.{e4m3,e5m2}x2.f32, one instruction for two values: the same RNE with subnormals and
    -0.0 -> 0x80, and satfinite is the clamp: beyond the max, Inf included, it gives the max) instead of
    the clamp and _fp8_rne's integer arithmetic; NaN is mapped to 0x7F either way."""
    if HW_CVT:
        fp8 = scaled.to(tl.float8e4nv) if MANT == 3 else scaled.to(tl.float8e5)
        return tl.where(scaled != scaled, 0x7F, fp8.to(tl.uint8, bitcast=True).to(tl.int32))
    else:
        scaled = tl.where(scaled > FP8_MAX, FP8_MAX, tl.where(scaled < -FP8_MAX, -FP8_MAX, scaled))
        return _fp8_rne(scaled, MANT, BIAS)


def _fp8_hw_cvt(x: torch.Tensor) -> bool:
    """Whether the FP8 kernels convert with the GPU's cvt instruction (CUDA sm_89+; not in the interpreter)."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 9)


@triton.jit
def _fp8_blockwise_kernel(
    x_ptr, data_ptr, scales_ptr, values_ptr, rows, cols, scale_for_inf,
    TILE_R: tl.constexpr, FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
    POW2: tl.constexpr, HW_CVT: tl.constexpr, DENSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """fp8.quantize_blockwise (and fake_quantize_blockwise when DENSE) on a BLOCK_R x BLOCK_C tile
    of TILE_R x 128 blocks."""
    NR: tl.constexpr = BLOCK_R // TILE_R
    NC: tl.constexpr = BLOCK_C // 128
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r[:, None].to(tl.int64) * cols + c[None, :]
    x = _to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))

    x4 = tl.reshape(x, (NR, TILE_R, NC, 128))
    magnitude_bits = x4.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax = tl.max(tl.max(magnitude_bits, axis=3), axis=1).to(tl.float32, bitcast=True)  # [NR, NC]
    encode, decode = _fp8_block_scales(amax, scale_for_inf, FP8_MAX, POW2)
    code = _fp8_codes(x4 * encode[:, None, :, None], FP8_MAX, MANT, BIAS, HW_CVT)
    if DENSE:
        values = tl.reshape(_fp8_value(code, MANT, BIAS) * decode[:, None, :, None], (BLOCK_R, BLOCK_C))
        _store_as(values_ptr, offs, values, mask)
    else:
        tl.store(data_ptr + offs, tl.reshape(code, (BLOCK_R, BLOCK_C)).to(tl.uint8), mask=mask)
        sr = pid_r * NR + tl.arange(0, NR)
        sc = pid_c * NC + tl.arange(0, NC)
        smask = (sr[:, None] < rows // TILE_R) & (sc[None, :] < cols // 128)
        tl.store(scales_ptr + sr[:, None].to(tl.int64) * (cols // 128) + sc[None, :], decode, mask=smask)


def fp8_blockwise(
    x: torch.Tensor, block, dtype: torch.dtype, pow2_scales: bool, *, dense: bool, out_dtype=torch.float32
):
    """fp8.quantize_blockwise of x viewed as [rows, cols] (arguments checked by the caller):
    (data uint8 bits of ``dtype``, x's shape; decode scales FP32), or with dense=True the
    dequantized values in out_dtype."""
    x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    tile_r = block[0]
    block_r, block_c = (128, 128) if tile_r == 128 else (8, 256)
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    if dense:
        values = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        data = scales = values
    else:
        data = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        scales = torch.empty((rows // tile_r, cols // 128), dtype=torch.float32, device=x.device)
        values = data
    options = _launch_options(x)
    if x.is_cuda and tile_r == 128:
        options["num_warps"] = 8
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _fp8_blockwise_kernel[grid](
        x, data, scales, values, rows, cols, float(torch.finfo(x.dtype).max),
        TILE_R=tile_r, FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias, POW2=pow2_scales,
        HW_CVT=_fp8_hw_cvt(x), DENSE=dense, BLOCK_R=block_r, BLOCK_C=block_c, **options,
    )
    return values if dense else (data, scales)


# ------------------------------------------------------------------------------ FP8 tensorwise
TENSORWISE_BLOCK = 4096


@triton.jit
def _fp8_tensorwise_kernel(x_ptr, amax_ptr, data_ptr, decode_ptr, n, FP8_MAX: tl.constexpr, MANT: tl.constexpr,
                           BIAS: tl.constexpr, POW2: tl.constexpr, HW_CVT: tl.constexpr, BLOCK: tl.constexpr):
    """fp8.quantize_tensorwise's cast: x * encode clamped to the format's max, RNE to FP8 bits. Every
    program derives encode = encode_scale_from_amax(max|x|) from the amax pass's result itself (a few
    ALU operations, no extra launch); program 0 stores the decode scale 1 / encode."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = _to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))
    encode, decode = _fp8_block_scales(tl.load(amax_ptr), _FLT_MAX, FP8_MAX, POW2)  # per tensor: FLT_MAX for inf
    tl.store(data_ptr + offs, _fp8_codes(x * encode, FP8_MAX, MANT, BIAS, HW_CVT).to(tl.uint8), mask=mask)
    if tl.program_id(0) == 0:
        tl.store(decode_ptr, decode)


def fp8_tensorwise(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8.quantize_tensorwise (arguments checked by the caller): (data in ``dtype``, x's shape; FP32 0-d
    decode scale), in two reads of x (the amax, then the cast) where the eager reference makes about
    six passes over an FP32 copy; no host sync."""
    x = x.contiguous()
    n = x.numel()
    amax = abs_max(x)
    data = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    decode = torch.empty((), dtype=torch.float32, device=x.device)
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    _fp8_tensorwise_kernel[(triton.cdiv(n, TENSORWISE_BLOCK),)](
        x, amax, data, decode, n, FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias, POW2=pow2_scales,
        HW_CVT=_fp8_hw_cvt(x), BLOCK=TENSORWISE_BLOCK, **_launch_options(x),
    )
    return data.view(dtype), decode


@triton.jit
def _fp8_tensorwise_rowcol_kernel(x_ptr, amax_ptr, data_ptr, data_t_ptr, decode_ptr, rows, cols,
                                  FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, POW2: tl.constexpr,
                                  HW_CVT: tl.constexpr, BLOCK: tl.constexpr):
    """_fp8_tensorwise_kernel's cast of a BLOCK x BLOCK tile of x [rows, cols], stored twice: as it is
    and transposed ([cols, rows]). The transpose moves the one-byte codes through shared memory inside
    the program instead of a separate transposing copy of the whole tensor."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = _to_fp32(tl.load(x_ptr + r[:, None].to(tl.int64) * cols + c[None, :], mask=mask, other=0.0))
    encode, decode = _fp8_block_scales(tl.load(amax_ptr), _FLT_MAX, FP8_MAX, POW2)
    code = _fp8_codes(x * encode, FP8_MAX, MANT, BIAS, HW_CVT).to(tl.uint8)
    tl.store(data_ptr + r[:, None].to(tl.int64) * cols + c[None, :], code, mask=mask)
    tl.store(data_t_ptr + c[:, None].to(tl.int64) * rows + r[None, :], tl.trans(code), mask=tl.trans(mask))
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(decode_ptr, decode)


TENSORWISE_TILE = 64


def fp8_tensorwise_rowcol(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool):
    """(data [rows, cols], data_t [cols, rows], decode) of a 2-D x: fp8_tensorwise's codes, and the same
    codes transposed, from the amax pass and one cast pass (data as uint8 bits of ``dtype``)."""
    x = x.contiguous()
    rows, cols = x.shape
    amax = abs_max(x)
    data = torch.empty((rows, cols), dtype=torch.uint8, device=x.device)
    data_t = torch.empty((cols, rows), dtype=torch.uint8, device=x.device)
    decode = torch.empty((), dtype=torch.float32, device=x.device)
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    grid = (triton.cdiv(rows, TENSORWISE_TILE), triton.cdiv(cols, TENSORWISE_TILE))
    _fp8_tensorwise_rowcol_kernel[grid](
        x, amax, data, data_t, decode, rows, cols, FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias,
        POW2=pow2_scales, HW_CVT=_fp8_hw_cvt(x), BLOCK=TENSORWISE_TILE, **_launch_options(x),
    )
    return data, data_t, decode


@triton.jit
def _fp8_dequantize_blockwise_kernel(data_ptr, scales_ptr, values_ptr, rows, cols, TILE_R: tl.constexpr,
                                     MANT: tl.constexpr, BIAS: tl.constexpr, BLOCK_R: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
    """fp8.dequantize_blockwise: FP8 bits x their TILE_R x 128 block's FP32 decode scale (FP32 product),
    rounded to the output's dtype; one read of the codes, one write of the values."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r[:, None].to(tl.int64) * cols + c[None, :]
    code = tl.load(data_ptr + offs, mask=mask, other=0).to(tl.int32)
    scale_offs = (r // TILE_R)[:, None].to(tl.int64) * (cols // 128) + (c // 128)[None, :]
    scale = tl.load(scales_ptr + scale_offs, mask=mask, other=1.0)
    _store_as(values_ptr, offs, _fp8_value(code, MANT, BIAS) * scale, mask)


def fp8_dequantize_blockwise(data: torch.Tensor, scales: torch.Tensor, block, dtype: torch.dtype) -> torch.Tensor:
    """fp8.dequantize_blockwise (arguments checked by the caller): values in ``dtype``, data's shape."""
    data = data.contiguous()
    cols = data.shape[-1]
    rows = data.numel() // cols
    mant, bias = (3, 7) if data.dtype == torch.float8_e4m3fn else (2, 15)
    values = torch.empty(data.shape, dtype=dtype, device=data.device)
    block_r, block_c = 8, 256
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _fp8_dequantize_blockwise_kernel[grid](
        data.view(torch.uint8), scales.contiguous(), values, rows, cols, TILE_R=block[0], MANT=mant, BIAS=bias,
        BLOCK_R=block_r, BLOCK_C=block_c, **_launch_options(data),
    )
    return values


@triton.jit
def _fp8_blockwise_t_kernel(
    x_ptr, data_ptr, scales_ptr, n_tokens, n_features, scale_for_inf,
    FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, POW2: tl.constexpr, HW_CVT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """fp8.quantize_blockwise(x.t(), (1, 128)) from x [tokens, features] row-major: a BLOCK_T x BLOCK_F
    tile is read as it lies, each feature's 128-token blocks scaled (as _fp8_blockwise_kernel), and the
    codes stored transposed ([features, tokens], contiguous along tokens) with their [features,
    tokens / 128] scales; the transposed copy of x is never written."""
    NT: tl.constexpr = BLOCK_T // 128
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (t[:, None] < n_tokens) & (f[None, :] < n_features)
    x = _to_fp32(tl.load(x_ptr + t[:, None].to(tl.int64) * n_features + f[None, :], mask=mask, other=0.0))

    x3 = tl.reshape(x, (NT, 128, BLOCK_F))
    magnitude_bits = x3.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax = tl.max(magnitude_bits, axis=1).to(tl.float32, bitcast=True)  # [NT, BLOCK_F]
    encode, decode = _fp8_block_scales(amax, scale_for_inf, FP8_MAX, POW2)
    code = _fp8_codes(x3 * encode[:, None, :], FP8_MAX, MANT, BIAS, HW_CVT)
    code = tl.trans(tl.reshape(code, (BLOCK_T, BLOCK_F)))  # [BLOCK_F, BLOCK_T]
    out_mask = (f[:, None] < n_features) & (t[None, :] < n_tokens)
    tl.store(data_ptr + f[:, None].to(tl.int64) * n_tokens + t[None, :], code.to(tl.uint8), mask=out_mask)
    tb = pid_t * NT + tl.arange(0, NT)
    smask = (tb[:, None] < n_tokens // 128) & (f[None, :] < n_features)
    tl.store(scales_ptr + f[None, :].to(tl.int64) * (n_tokens // 128) + tb[:, None], decode, mask=smask)


def fp8_blockwise_t(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8.quantize_blockwise(x.t(), (1, 128)) of x [tokens, features] (tokens a multiple of 128; checked
    by the caller): (data uint8 bits of ``dtype`` [features, tokens], decode scales FP32 [features,
    tokens / 128])."""
    x = x.contiguous()
    n_tokens, n_features = x.shape
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    data = torch.empty((n_features, n_tokens), dtype=torch.uint8, device=x.device)
    scales = torch.empty((n_features, n_tokens // 128), dtype=torch.float32, device=x.device)
    block_t, block_f = 128, 64
    grid = (triton.cdiv(n_tokens, block_t), triton.cdiv(n_features, block_f))
    _fp8_blockwise_t_kernel[grid](
        x, data, scales, n_tokens, n_features, float(torch.finfo(x.dtype).max),
        FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias, POW2=pow2_scales, HW_CVT=_fp8_hw_cvt(x),
        BLOCK_T=block_t, BLOCK_F=block_f, **_launch_options(x),
    )
    return data, scales


# ------------------------------------------------------------------------------ emulated GEMM epilogue
SCALE_CAST_BLOCK = 4096


@triton.jit
def _scale_and_cast_kernel(x_ptr, a_ptr, b_ptr, y_ptr, n, HAS_A: tl.constexpr, HAS_B: tl.constexpr,
                           BLOCK: tl.constexpr):
    """y = ((x * a) * b) in y's dtype, each product rounded in FP32 and the cast to nearest even, as
    eager's `out * a * b` then `.to(dtype)`: one read of the FP32 GEMM output, one write."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_A:
        v = v * tl.load(a_ptr)
    if HAS_B:
        v = v * tl.load(b_ptr)
    _store_as(y_ptr, offs, v, mask)


def scale_and_cast(x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None, dtype: torch.dtype):
    """((x * a) * b).to(dtype) of a contiguous FP32 x with 0-d FP32 a, b (None: no factor), in one pass."""
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    n = x.numel()
    _scale_and_cast_kernel[(triton.cdiv(n, SCALE_CAST_BLOCK),)](
        x, x if a is None else a, x if b is None else b, y, n, HAS_A=a is not None, HAS_B=b is not None,
        BLOCK=SCALE_CAST_BLOCK, **_launch_options(x),
    )
    return y


# ------------------------------------------------------------------------------ NVFP4 / MXFP4 dequantize
@triton.jit
def _e2m1_dequantize_kernel(codes_ptr, scales_ptr, global_ptr, values_ptr, rows, cols, GROUP: tl.constexpr,
                            E8M0: tl.constexpr, HAS_GLOBAL: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_C: tl.constexpr):
    """NVFP4Tensor / MXFP4Tensor.dequantize: e2m1(code) x its GROUP-element block scale (E4M3, or E8M0
    when E8M0), exact in FP32, times the global decode scale when HAS_GLOBAL (FP32-rounded), rounded to
    the output's dtype; one read of the packed codes and scales, one write. The columns (``cols``, even,
    a multiple of GROUP) split into BLOCK_C-wide tiles, BLOCK_C a multiple of GROUP."""
    NB: tl.constexpr = BLOCK_C // GROUP
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row = r[:, None].to(tl.int64)
    row_ok = r[:, None] < rows
    # Each code byte once (element 2j in the low nibble, 2j + 1 in the high one), each block scale once,
    # both spread over their elements in registers.
    c2 = tl.program_id(1) * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
    byte = tl.load(codes_ptr + row * (cols // 2) + c2[None, :], mask=row_ok & (c2[None, :] < cols // 2),
                   other=0).to(tl.int32)
    code = tl.reshape(tl.join(byte & 0xF, (byte >> 4) & 0xF), (BLOCK_R, BLOCK_C))
    value = _with_sign(_e2m1_magnitude(code & 0x7), (code & 0x8) != 0)  # code 0x8 is -0.0 (0 - x would give +0.0)
    cb = tl.program_id(1) * NB + tl.arange(0, NB)
    bits = tl.load(scales_ptr + row * (cols // GROUP) + cb[None, :], mask=row_ok & (cb[None, :] < cols // GROUP),
                   other=0).to(tl.int32)
    if E8M0:
        scale = (tl.maximum(bits, 1) << 23).to(tl.float32, bitcast=True)  # 2^(bits - 127)
        scale = tl.where(bits == 0, 2.0**-127, scale)
        scale = tl.where(bits == 255, float("nan"), scale)
    else:
        scale = _fp8_value(bits, 3, 7)  # E4M3
    out = tl.reshape(tl.reshape(value, (BLOCK_R, NB, GROUP)) * scale[:, :, None], (BLOCK_R, BLOCK_C))
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = row_ok & (c[None, :] < cols)
    if HAS_GLOBAL:
        _store_as(values_ptr, row * cols + c[None, :], out * tl.load(global_ptr), mask)
    else:  # code x block scale: exact in the output's dtype
        _store_exact(values_ptr, row * cols + c[None, :], out, mask)


def e2m1_dequantize(codes: torch.Tensor, scales: torch.Tensor, global_decode_scale: torch.Tensor | None,
                    shape, group: int, e8m0: bool, dtype: torch.dtype) -> torch.Tensor:
    """Values in ``dtype`` of logical ``shape`` from packed E2M1 codes and per-``group`` scales (E4M3 for
    NVFP4, E8M0 for MXFP4), times ``global_decode_scale`` when given."""
    cols = shape[-1]
    rows = codes.numel() * 2 // cols
    values = torch.empty(shape, dtype=dtype, device=codes.device)
    block_r, block_c = 8, 256
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _e2m1_dequantize_kernel[grid](
        codes.contiguous(), scales.contiguous().view(torch.uint8),
        values if global_decode_scale is None else global_decode_scale, values, rows, cols,
        GROUP=group, E8M0=e8m0, HAS_GLOBAL=global_decode_scale is not None, BLOCK_R=block_r, BLOCK_C=block_c,
        **_launch_options(codes),
    )
    return values


@triton.jit
def _fp8_blockwise_rowcol_kernel(
    x_ptr, row_data_ptr, row_scales_ptr, col_data_ptr, col_scales_ptr, n_tokens, n_features, row_width,
    scale_for_inf, FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, POW2: tl.constexpr,
    HW_CVT: tl.constexpr, RAGGED: tl.constexpr,
):
    """Both FP8 blockwise copies of x [tokens, features] from one read of a 128 x 128 tile:
    quantize_blockwise(x zero-padded to [tokens, row_width], (1, 128)) (blocks along features: Fprop / Dgrad
    operand) and quantize_blockwise(x.t(), (1, 128)) (blocks along tokens, stored transposed: Wgrad
    operand, features unpadded). RAGGED: row_width > features (the tiles past features read zeros)."""
    t = tl.program_id(0) * 128 + tl.arange(0, 128)
    f = tl.program_id(1) * 128 + tl.arange(0, 128)
    if RAGGED:
        x = _to_fp32(tl.load(x_ptr + t[:, None].to(tl.int64) * n_features + f[None, :],
                             mask=f[None, :] < n_features, other=0.0))
    else:
        x = _to_fp32(tl.load(x_ptr + t[:, None].to(tl.int64) * n_features + f[None, :]))
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF

    row_encode, row_decode = _fp8_block_scales(tl.max(magnitude_bits, axis=1).to(tl.float32, bitcast=True),
                                               scale_for_inf, FP8_MAX, POW2)  # [128 tokens]
    row_code = _fp8_codes(x * row_encode[:, None], FP8_MAX, MANT, BIAS, HW_CVT)
    tl.store(row_data_ptr + t[:, None].to(tl.int64) * row_width + f[None, :], row_code.to(tl.uint8))
    tl.store(row_scales_ptr + t.to(tl.int64) * (row_width // 128) + tl.program_id(1), row_decode)

    col_encode, col_decode = _fp8_block_scales(tl.max(magnitude_bits, axis=0).to(tl.float32, bitcast=True),
                                               scale_for_inf, FP8_MAX, POW2)  # [128 features]
    col_code = tl.trans(_fp8_codes(x * col_encode[None, :], FP8_MAX, MANT, BIAS, HW_CVT))  # [features, tokens]
    if RAGGED:
        tl.store(col_data_ptr + f[:, None].to(tl.int64) * n_tokens + t[None, :], col_code.to(tl.uint8),
                 mask=f[:, None] < n_features)
        tl.store(col_scales_ptr + f.to(tl.int64) * (n_tokens // 128) + tl.program_id(0), col_decode,
                 mask=f < n_features)
    else:
        tl.store(col_data_ptr + f[:, None].to(tl.int64) * n_tokens + t[None, :], col_code.to(tl.uint8))
        tl.store(col_scales_ptr + f.to(tl.int64) * (n_tokens // 128) + tl.program_id(0), col_decode)


def fp8_blockwise_rowcol(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool, row_width: int):
    """((data [tokens, row_width], scales [tokens, row_width / 128]), (data [features, tokens], scales
    [features, tokens / 128])) of x [tokens, features]: tokens and row_width multiples of 128, row_width >=
    features (checked by the caller; the row copy is of x zero-padded to row_width); data as uint8 bits of
    ``dtype``."""
    x = x.contiguous()
    n_tokens, n_features = x.shape
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    row_data = torch.empty((n_tokens, row_width), dtype=torch.uint8, device=x.device)
    row_scales = torch.empty((n_tokens, row_width // 128), dtype=torch.float32, device=x.device)
    col_data = torch.empty((n_features, n_tokens), dtype=torch.uint8, device=x.device)
    col_scales = torch.empty((n_features, n_tokens // 128), dtype=torch.float32, device=x.device)
    options = _launch_options(x)
    if x.is_cuda:
        options["num_warps"] = 8
    _fp8_blockwise_rowcol_kernel[(n_tokens // 128, row_width // 128)](
        x, row_data, row_scales, col_data, col_scales, n_tokens, n_features, row_width,
        float(torch.finfo(x.dtype).max), FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias,
        POW2=pow2_scales, HW_CVT=_fp8_hw_cvt(x), RAGGED=row_width != n_features, **options,
    )
    return (row_data, row_scales), (col_data, col_scales)
