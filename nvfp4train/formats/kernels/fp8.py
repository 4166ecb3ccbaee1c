"""FP8 (E4M3 / E5M2) blockwise and tensorwise quantizers: mirror ``formats/fp8.py``'s
``quantize_blockwise`` / ``quantize_tensorwise`` (RNE with subnormals, NaN -> 0x7F)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .amax import abs_max
from .common import (
    FLT_MAX,
    PROLOGUE_CODES,
    apply_prologue,
    hw_bf16,
    launch_options,
    store_as,
    tile_offsets,
    to_fp32,
    with_sign,
)


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
    # Below the smallest normal 2^(1 - BIAS): a / 2^(1 - BIAS - MANT) rounded to an integer (see e4m3_rne).
    subnormal = ((a * (2.0 ** (BIAS - 1 + MANT))) + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    code = tl.where(a < 2.0 ** (1 - BIAS), subnormal, normal)
    return tl.where(v != v, 0x7F, code | sign)


@triton.jit
def fp8_value(code, MANT: tl.constexpr, BIAS: tl.constexpr):
    """FP8 bits (int32) -> FP32 value (``.to(torch.float32)``); 0x7F / 0xFF -> NaN."""
    magnitude = code & 0x7F
    exponent = magnitude >> MANT
    fraction = magnitude & ((1 << MANT) - 1)
    normal = (((exponent + (127 - BIAS)) << 23) | (fraction << (23 - MANT))).to(tl.float32, bitcast=True)
    subnormal = fraction.to(tl.float32) * (2.0 ** (1 - BIAS - MANT))
    value = tl.where(exponent == 0, subnormal, normal)
    value = tl.where(magnitude == 0x7F, float("nan"), value)
    return with_sign(value, (code & 0x80) != 0)


@triton.jit
def _fp8_block_scales(amax, scale_for_inf, FP8_MAX: tl.constexpr, POW2: tl.constexpr):
    """encode_scale_from_amax for FP32 block maxima (any shape): (encode, decode)."""
    if POW2:
        return _fp8_pow2_scales(amax, scale_for_inf, FP8_MAX)
    encode = tl.div_rn(tl.full(amax.shape, FP8_MAX, tl.float32), amax)
    encode = tl.where(encode == float("inf"), scale_for_inf, encode)
    encode = tl.where(amax == 0, 1.0, encode)
    encode = tl.where(amax <= FLT_MAX, encode, float("nan"))
    return encode, tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), encode)


@triton.jit
def _fp8_pow2_scales(amax, scale_for_inf, FP8_MAX: tl.constexpr):
    """_fp8_block_scales with power-of-two scales by integer arithmetic on amax's bits: the same values as
    dividing, rounding down to a power of two and dividing again, without the two divisions (a thread computes
    the scales of every block its elements touch: 20 in a rowcol program's thread).

    Both formats' maxima are 1.75 2^L (448 = 1.75 2^8, 57344 = 1.75 2^15). For amax = m 2^e (m in [1, 2)),
    FP8_MAX / amax = (1.75 / m) 2^(L - e): its binade is 2^(L - e) where m <= 1.75, else 2^(L - e - 1), and
    rounding the quotient to FP32 never lifts it into the next binade (1.75 / m <= 1.75; and 1.75 / m <= 1 -
    2^-23 / 1.75 < 1 - 2^-25 where m > 1.75). So encode's biased exponent is L + 254 - E - (mantissa above
    1.75's), E amax's biased exponent; 255 or more is the overflow to scale_for_inf (a subnormal amax, E = 0,
    lands there too). decode = 1 / encode is exact."""
    tl.static_assert((FP8_MAX == 448.0) or (FP8_MAX == 57344.0), "E4M3 or E5M2 maxima")
    L: tl.constexpr = 8 if FP8_MAX == 448.0 else 15
    bits = amax.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    biased = (L + 254) - (bits >> 23) - ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    inf_biased = (tl.cast(scale_for_inf, tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF
    biased = tl.where(biased >= 255, inf_biased, biased)
    encode_bits = tl.where(bits == 0, 127 << 23, biased << 23)  # amax 0: scale 1
    # 1 / 2^k as the word of 2^(1 - k) halved: the halving makes 2^-127 (encode 2^127) subnormal, exactly.
    decode = (0x7F800000 - encode_bits).to(tl.float32, bitcast=True) * 0.5
    finite = bits < 0x7F800000  # amax Inf or NaN: both scales NaN
    encode = tl.where(finite, encode_bits.to(tl.float32, bitcast=True), float("nan"))
    decode = tl.where(finite, decode, float("nan"))
    return encode, decode


@triton.jit
def _fp8_codes(scaled, encode, FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, HW_CVT: tl.constexpr,
               STORED_AS_IS: tl.constexpr = False):
    """Clamp to the format's max, then RNE to FP8 bits (int32; uint8 where STORED_AS_IS on the GPU), of ``scaled`` =
    x * ``encode`` (encode broadcast over x: one per block or tensor). HW_CVT (sm_89+): the GPU's own conversion
    (cvt.rn.satfinite.{e4m3,e5m2}x2.f32, one instruction for two values: the same RNE with subnormals and -0.0 ->
    0x80; satfinite is the clamp: beyond the max, Inf included, it gives the max; a NaN product gives 0x7F)
    instead of the clamp and _fp8_rne's integer arithmetic, whose rules are the same.

    A scaled value is NaN exactly where its block's encode is (NaN where the block holds a NaN or an Inf,
    finite and nonzero otherwise), so the select that maps NaN to 0x7F keys on the block, not on each
    element. On the GPU the cast gives 0x7F already, and the select is there for what follows: codes that
    are transposed or reshaped before their store must come from it. Triton (3.7) otherwise moves the layout
    conversion onto the cast's packed bytes, which permuted codes on an H200 (tests/formats/test_triton.py's
    tensorwise rowcol and 1x128 dense cases). STORED_AS_IS: codes stored in the layout they were computed
    in, the cast's bytes as they are (no select: it costs unpacking, selecting and repacking each pair)."""
    if HW_CVT:
        fp8 = scaled.to(tl.float8e4nv) if MANT == 3 else scaled.to(tl.float8e5)
        code = fp8.to(tl.uint8, bitcast=True)
        if not STORED_AS_IS:
            code = tl.where(encode != encode, 0x7F, code.to(tl.int32))
        return code
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
    r, c, mask, offs = tile_offsets(pid_r * BLOCK_R, pid_c * BLOCK_C, rows, cols, BLOCK_R, BLOCK_C)
    x = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))

    x4 = tl.reshape(x, (NR, TILE_R, NC, 128))
    magnitude_bits = x4.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax = tl.max(tl.max(magnitude_bits, axis=3), axis=1).to(tl.float32, bitcast=True)  # [NR, NC]
    encode, decode = _fp8_block_scales(amax, scale_for_inf, FP8_MAX, POW2)
    code = _fp8_codes(x4 * encode[:, None, :, None], encode[:, None, :, None], FP8_MAX, MANT, BIAS, HW_CVT)
    if DENSE:
        values = tl.reshape(fp8_value(code, MANT, BIAS) * decode[:, None, :, None], (BLOCK_R, BLOCK_C))
        store_as(values_ptr, offs, values, mask)
    else:
        tl.store(data_ptr + offs, tl.reshape(code, (BLOCK_R, BLOCK_C)).to(tl.uint8), mask=mask)
        sr = pid_r * NR + tl.arange(0, NR)
        sc = pid_c * NC + tl.arange(0, NC)
        smask = (sr[:, None] < rows // TILE_R) & (sc[None, :] < cols // 128)
        tl.store(scales_ptr + sr[:, None].to(tl.int64) * (cols // 128) + sc[None, :], decode, mask=smask)


def blockwise(
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
    options = launch_options(x)
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
    x = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0))
    encode, decode = _fp8_block_scales(tl.load(amax_ptr), FLT_MAX, FP8_MAX, POW2)  # per tensor: FLT_MAX for inf
    tl.store(data_ptr + offs, _fp8_codes(x * encode, encode, FP8_MAX, MANT, BIAS, HW_CVT).to(tl.uint8), mask=mask)
    if tl.program_id(0) == 0:
        tl.store(decode_ptr, decode)


def tensorwise(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
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
        HW_CVT=_fp8_hw_cvt(x), BLOCK=TENSORWISE_BLOCK, **launch_options(x),
    )
    return data.view(dtype), decode


@triton.jit
def _fp8_tensorwise_rowcol_kernel(x_ptr, a_ptr, amax_ptr, data_ptr, data_t_ptr, decode_ptr, rows, cols,
                                  FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, POW2: tl.constexpr,
                                  HW_CVT: tl.constexpr, BLOCK: tl.constexpr, PROLOGUE: tl.constexpr = 0,
                                  HW_BF16: tl.constexpr = False):
    """_fp8_tensorwise_kernel's cast of a BLOCK x BLOCK tile of x [rows, cols], stored twice: as it is
    and transposed ([cols, rows]). The transpose moves the one-byte codes through shared memory inside
    the program instead of a separate transposing copy of the whole tensor. PROLOGUE: the tile is
    `apply_prologue`'s output (a_ptr: the activation's input, read for squared_relu_grad)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(x_ptr + r[:, None].to(tl.int64) * cols + c[None, :], mask=mask, other=0.0)
    if PROLOGUE == 2:
        a = tl.load(a_ptr + r[:, None].to(tl.int64) * cols + c[None, :], mask=mask, other=0.0)
        x = apply_prologue(x, a, PROLOGUE, HW_BF16)
    else:
        x = apply_prologue(x, x, PROLOGUE, HW_BF16)
    x = to_fp32(x)
    encode, decode = _fp8_block_scales(tl.load(amax_ptr), FLT_MAX, FP8_MAX, POW2)
    code = _fp8_codes(x * encode, encode, FP8_MAX, MANT, BIAS, HW_CVT).to(tl.uint8)
    tl.store(data_ptr + r[:, None].to(tl.int64) * cols + c[None, :], code, mask=mask)
    tl.store(data_t_ptr + c[:, None].to(tl.int64) * rows + r[None, :], tl.trans(code), mask=tl.trans(mask))
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(decode_ptr, decode)


TENSORWISE_TILE, TENSORWISE_WARPS = 64, 4


def tensorwise_rowcol(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool, prologue: str | None = None,
                      act_input: torch.Tensor | None = None):
    """(data [rows, cols], data_t [cols, rows], decode) of a 2-D x: fp8_tensorwise's codes, and the same
    codes transposed, from the amax pass and one cast pass (data as uint8 bits of ``dtype``). With a prologue, of
    activation.apply(prologue, x, act_input) (x and act_input bf16), which is never written."""
    x = x.contiguous()
    act_input = None if act_input is None else act_input.contiguous()
    rows, cols = x.shape
    amax = abs_max(x, prologue, act_input)
    data = torch.empty((rows, cols), dtype=torch.uint8, device=x.device)
    data_t = torch.empty((cols, rows), dtype=torch.uint8, device=x.device)
    decode = torch.empty((), dtype=torch.float32, device=x.device)
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    grid = (triton.cdiv(rows, TENSORWISE_TILE), triton.cdiv(cols, TENSORWISE_TILE))
    options = launch_options(x)
    if x.is_cuda:
        options["num_warps"] = TENSORWISE_WARPS
    _fp8_tensorwise_rowcol_kernel[grid](
        x, x if act_input is None else act_input, amax, data, data_t, decode, rows, cols,
        FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias, POW2=pow2_scales, HW_CVT=_fp8_hw_cvt(x),
        BLOCK=TENSORWISE_TILE, PROLOGUE=PROLOGUE_CODES[prologue], HW_BF16=prologue is not None and hw_bf16(x),
        **options,
    )
    return data, data_t, decode


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
    x = to_fp32(tl.load(x_ptr + t[:, None].to(tl.int64) * n_features + f[None, :], mask=mask, other=0.0))

    x3 = tl.reshape(x, (NT, 128, BLOCK_F))
    magnitude_bits = x3.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax = tl.max(magnitude_bits, axis=1).to(tl.float32, bitcast=True)  # [NT, BLOCK_F]
    encode, decode = _fp8_block_scales(amax, scale_for_inf, FP8_MAX, POW2)
    code = _fp8_codes(x3 * encode[:, None, :], encode[:, None, :], FP8_MAX, MANT, BIAS, HW_CVT)
    code = tl.trans(tl.reshape(code, (BLOCK_T, BLOCK_F)))  # [BLOCK_F, BLOCK_T]
    out_mask = (f[:, None] < n_features) & (t[None, :] < n_tokens)
    tl.store(data_ptr + f[:, None].to(tl.int64) * n_tokens + t[None, :], code.to(tl.uint8), mask=out_mask)
    tb = pid_t * NT + tl.arange(0, NT)
    smask = (tb[:, None] < n_tokens // 128) & (f[None, :] < n_features)
    tl.store(scales_ptr + f[None, :].to(tl.int64) * (n_tokens // 128) + tb[:, None], decode, mask=smask)


def blockwise_t(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
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
        BLOCK_T=block_t, BLOCK_F=block_f, **launch_options(x),
    )
    return data, scales


@triton.jit
def _abs_max_fp32(x, axis: tl.constexpr):
    """max |x| along ``axis`` of a bf16 or FP32 tile, as FP32 (NaN where a NaN is: its magnitude's bits are the
    largest). A bf16 tile is reduced on its 16-bit words, so it never needs an FP32 copy held alongside it."""
    if x.dtype == tl.bfloat16:
        m = tl.max(x.to(tl.int16, bitcast=True) & 0x7FFF, axis=axis)
        amax = (m.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        amax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis).to(tl.float32, bitcast=True)
    return amax


@triton.jit
def _fp8_blockwise_rowcol_kernel(
    x_ptr, a_ptr, row_data_ptr, row_scales_ptr, col_data_ptr, col_scales_ptr, n_tokens, n_features, row_width,
    scale_for_inf, FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, POW2: tl.constexpr,
    HW_CVT: tl.constexpr, RAGGED: tl.constexpr, PROLOGUE: tl.constexpr = 0, HW_BF16: tl.constexpr = False,
):
    """Both FP8 blockwise copies of x [tokens, features] from one read of a 128 x 128 tile:
    quantize_blockwise(x zero-padded to [tokens, row_width], (1, 128)) (blocks along features: Fprop / Dgrad
    operand) and quantize_blockwise(x.t(), (1, 128)) (blocks along tokens, stored transposed: Wgrad
    operand, features unpadded). RAGGED: row_width > features (the tiles past features read zeros).

    The tile stays in x's dtype (bf16: half the registers of an FP32 copy, two programs a multiprocessor) and
    the column copy is made from the tile transposed, not from codes transposed: shared memory moves 16-bit
    words without the bank conflicts of single bytes. Each program's scales are contiguous runs: both scale
    tensors are stored with the 128-element blocks' index outermost ([row_width / 128, tokens] and
    [tokens / 128, features]), which is also the layout torch._scaled_mm takes them in. What these gain:
    docs/results/code-measurements.md.

    PROLOGUE (bf16 x): the tile quantized is `apply_prologue`'s output (a_ptr: the activation's input, read for
    squared_relu_grad), so the activation's output is never written."""
    t = tl.program_id(0) * 128 + tl.arange(0, 128)
    f = tl.program_id(1) * 128 + tl.arange(0, 128)
    offs = t[:, None].to(tl.int64) * n_features + f[None, :]
    if RAGGED:
        x = tl.load(x_ptr + offs, mask=f[None, :] < n_features, other=0.0)
    else:
        x = tl.load(x_ptr + offs)
    if PROLOGUE == 2:
        if RAGGED:
            a = tl.load(a_ptr + offs, mask=f[None, :] < n_features, other=0.0)
        else:
            a = tl.load(a_ptr + offs)
        x = apply_prologue(x, a, PROLOGUE, HW_BF16)
    else:
        x = apply_prologue(x, x, PROLOGUE, HW_BF16)
    if x.dtype != tl.bfloat16:
        x = x.to(tl.float32)

    row_encode, row_decode = _fp8_block_scales(_abs_max_fp32(x, 1), scale_for_inf, FP8_MAX, POW2)  # [128 tokens]
    row_code = _fp8_codes(to_fp32(x) * row_encode[:, None], row_encode[:, None], FP8_MAX, MANT, BIAS, HW_CVT, True)
    tl.store(row_data_ptr + t[:, None].to(tl.int64) * row_width + f[None, :], row_code.to(tl.uint8))
    tl.store(row_scales_ptr + tl.program_id(1) * n_tokens + t, row_decode)

    xt = tl.trans(x)  # [features, tokens]
    col_encode, col_decode = _fp8_block_scales(_abs_max_fp32(xt, 1), scale_for_inf, FP8_MAX, POW2)  # [128 features]
    col_code = _fp8_codes(to_fp32(xt) * col_encode[:, None], col_encode[:, None], FP8_MAX, MANT, BIAS, HW_CVT, True)
    if RAGGED:
        tl.store(col_data_ptr + f[:, None].to(tl.int64) * n_tokens + t[None, :], col_code.to(tl.uint8),
                 mask=f[:, None] < n_features)
        tl.store(col_scales_ptr + tl.program_id(0) * n_features + f, col_decode, mask=f < n_features)
    else:
        tl.store(col_data_ptr + f[:, None].to(tl.int64) * n_tokens + t[None, :], col_code.to(tl.uint8))
        tl.store(col_scales_ptr + tl.program_id(0) * n_features + f, col_decode)


BLOCKWISE_ROWCOL_WARPS = 8


def blockwise_rowcol(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool, row_width: int,
                     prologue: str | None = None, act_input: torch.Tensor | None = None):
    """((data [tokens, row_width], scales [tokens, row_width / 128]), (data [features, tokens], scales
    [features, tokens / 128])) of x [tokens, features]: tokens and row_width multiples of 128, row_width >=
    features (checked by the caller; the row copy is of x zero-padded to row_width); data as uint8 bits of
    ``dtype``. The scales are transposed views (strides (1, tokens) and (1, features)): see the kernel. With a
    prologue, of activation.apply(prologue, x, act_input) (x and act_input bf16), which is never written."""
    x = x.contiguous()
    act_input = None if act_input is None else act_input.contiguous()
    n_tokens, n_features = x.shape
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    row_data = torch.empty((n_tokens, row_width), dtype=torch.uint8, device=x.device)
    row_scales = torch.empty((row_width // 128, n_tokens), dtype=torch.float32, device=x.device).t()
    col_data = torch.empty((n_features, n_tokens), dtype=torch.uint8, device=x.device)
    col_scales = torch.empty((n_tokens // 128, n_features), dtype=torch.float32, device=x.device).t()
    options = launch_options(x)
    if x.is_cuda:
        options["num_warps"] = BLOCKWISE_ROWCOL_WARPS
    _fp8_blockwise_rowcol_kernel[(n_tokens // 128, row_width // 128)](
        x, x if act_input is None else act_input, row_data, row_scales, col_data, col_scales, n_tokens, n_features,
        row_width, float(torch.finfo(x.dtype).max), FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias,
        POW2=pow2_scales, HW_CVT=_fp8_hw_cvt(x), RAGGED=row_width != n_features,
        PROLOGUE=PROLOGUE_CODES[prologue], HW_BF16=prologue is not None and hw_bf16(x), **options,
    )
    return (row_data, row_scales), (col_data, col_scales)


@triton.jit
def _fp8_tiles_rowcol_kernel(
    x_ptr, data_ptr, scales_ptr, data_t_ptr, scales_t_ptr, rows, cols, padded_rows, row_width, col_width,
    scale_for_inf, FP8_MAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr, POW2: tl.constexpr,
    HW_CVT: tl.constexpr,
):
    """One 128 x 128 tile of x [rows, cols] zero-padded to [col_width, row_width], quantized with one scale as
    _fp8_blockwise_kernel quantizes a 128x128 tile, and stored twice: as it lies into data [padded_rows,
    row_width] (tiles above padded_rows only) and transposed into data_t [row_width, col_width]; its decode
    scale into scales [padded_rows / 128, row_width / 128] and scales_t (the transposed grid). A tile of the
    padding (past rows or cols) reads zeros: codes 0, decode scale 1."""
    i, j = tl.program_id(0), tl.program_id(1)
    r = i * 128 + tl.arange(0, 128)
    c = j * 128 + tl.arange(0, 128)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = to_fp32(tl.load(x_ptr + r[:, None].to(tl.int64) * cols + c[None, :], mask=mask, other=0.0))
    magnitude_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    amax = tl.max(tl.max(magnitude_bits, axis=1, keep_dims=True), axis=0, keep_dims=True)  # [1, 1]
    encode, decode = _fp8_block_scales(amax.to(tl.float32, bitcast=True), scale_for_inf, FP8_MAX, POW2)
    code = _fp8_codes(x * encode, encode, FP8_MAX, MANT, BIAS, HW_CVT).to(tl.uint8)
    here = tl.zeros([1, 1], dtype=tl.int64)  # the one scale's offset, as a [1, 1] block like `decode`
    if i * 128 < padded_rows:
        tl.store(data_ptr + r[:, None].to(tl.int64) * row_width + c[None, :], code)
        tl.store(scales_ptr + here + i * (row_width // 128) + j, decode)
    tl.store(data_t_ptr + c[:, None].to(tl.int64) * col_width + r[None, :], tl.trans(code))
    tl.store(scales_t_ptr + here + j * (col_width // 128) + i, decode)


def tiles_rowcol(x: torch.Tensor, dtype: torch.dtype, pow2_scales: bool, row_width: int, col_width: int):
    """((data [rows_p, row_width], scales [rows_p / 128, row_width / 128]), (data_t [row_width, col_width],
    scales_t [row_width / 128, col_width / 128])) of a 2-D x [rows, cols], rows_p = rows rounded up to 128:
    fp8.quantize_tiles_rowcol (arguments checked by the caller: row_width >= cols, col_width >= rows_p, both
    multiples of 128); data as uint8 bits of ``dtype``. One read of x: no padded copy of it, no transposed
    copy of the codes."""
    x = x.contiguous()
    rows, cols = x.shape
    padded_rows = -(-rows // 128) * 128
    mant, bias = (3, 7) if dtype == torch.float8_e4m3fn else (2, 15)
    data = torch.empty((padded_rows, row_width), dtype=torch.uint8, device=x.device)
    scales = torch.empty((padded_rows // 128, row_width // 128), dtype=torch.float32, device=x.device)
    data_t = torch.empty((row_width, col_width), dtype=torch.uint8, device=x.device)
    scales_t = torch.empty((row_width // 128, col_width // 128), dtype=torch.float32, device=x.device)
    options = launch_options(x)
    if x.is_cuda:
        options["num_warps"] = 8
    _fp8_tiles_rowcol_kernel[(col_width // 128, row_width // 128)](
        x, data, scales, data_t, scales_t, rows, cols, padded_rows, row_width, col_width,
        float(torch.finfo(x.dtype).max), FP8_MAX=float(torch.finfo(dtype).max), MANT=mant, BIAS=bias,
        POW2=pow2_scales, HW_CVT=_fp8_hw_cvt(x), **options,
    )
    return (data, scales), (data_t, scales_t)
