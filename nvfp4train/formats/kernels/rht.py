"""Wgrad operands: the random Hadamard transform along tokens fused with the transpose and NVFP4 / MXFP4
quantization (mirrors ``hadamard.rht`` then ``nvfp4.quantize`` / ``mxfp4.quantize`` of the transposed tensor);
and ``rows``: ``hadamard.rht`` itself, along the last dimension (the RHT of Fprop and Dgrad operands, where a
recipe asks for it there)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import hadamard
from .common import abs_max_bits, e2m1_outputs, hw_bf16, launch_options, round_to, store_as, to_fp32
from .e2m1 import round_and_store_t
from .mxfp4 import e8m0_scales
from .nvfp4 import block_scales, global_scales_of, nvfp4_tile
from .rounding import SR_PHILOX, philox_seed, rounding_args

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
def _rht_matrix_row(i: tl.constexpr, j, ENTRY_BITS: tl.constexpr, SIGN_MASK: tl.constexpr):
    """Row i of rht_matrix(D) at columns j (FP32): s_i (-1)^popcount(i & j) |m|, |m| the FP32 with bits
    ENTRY_BITS and s_i = -1 where bit i of SIGN_MASK is set (D <= 256)."""
    parity = i & j  # popcount(i & j) mod 2, folding 8 bits
    parity = parity ^ (parity >> 4)
    parity = parity ^ (parity >> 2)
    parity = (parity ^ (parity >> 1)) & 1
    negative = parity ^ ((SIGN_MASK >> i) & 1)
    return ((negative << 31) | ENTRY_BITS).to(tl.float32, bitcast=True)


@triton.jit
def _rht_tokens(x_ptr, t0, f, mask_f, n_features, D: tl.constexpr, ENTRY_BITS: tl.constexpr,
                SIGN_MASK: tl.constexpr, GROUPS: tl.constexpr, BLOCK_F: tl.constexpr, ROUNDED: tl.constexpr = True,
                HW_BF16: tl.constexpr = False):
    """hadamard.rht(., D) along tokens for tokens t0 .. t0 + D GROUPS and features f: FP32
    [GROUPS, D, BLOCK_F], element (g, j, f) = sum_i x[t0 + D g + i, f] * m[i, j], each product
    rounded to FP32 and summed in index order i (hadamard.rht's loop), then rounded to x's dtype
    and back (ROUNDED=False: the FP32 sums, left unrounded; HW_BF16: see round_to).
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
        xi = to_fp32(tl.load(first + i * n_features, mask=mask_f[None, None, :], other=0.0))
        magnitude_bits = xi.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # max|x| (NaN above Inf), where asked
        x_bits = magnitude_bits if i == 0 else tl.maximum(x_bits, magnitude_bits)  # noqa: F821 (static_range: i == 0 first)
        m_i = _rht_matrix_row(i, j, ENTRY_BITS, SIGN_MASK)
        if i == 0:
            acc = xi * m_i[None, :, None]
        elif EXACT_PRODUCTS:
            # x * (±1/4) is exact for a 16-bit input (no rounding, no FP32 underflow), so the fused
            # multiply-add rounds once, as the product-then-sum does: one instruction, not two.
            acc = tl.fma(xi, m_i[None, :, None], acc)
        else:
            acc = acc + xi * m_i[None, :, None]
    y = round_to(acc, x_ptr.dtype.element_ty, HW_BF16) if ROUNDED else acc
    return y, tl.max(tl.max(tl.max(x_bits, axis=2), axis=1), axis=0)


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
    bits = abs_max_bits(y)
    rounded = round_to(bits.to(tl.float32, bitcast=True), x_ptr.dtype.element_ty)
    tl.store(partial_ptr + pid_t * tl.num_programs(1) + pid_f, rounded.to(tl.int32, bitcast=True))
    if ROWWISE:  # max|x| of the same tile, from the transform's loads
        tl.store(row_partial_ptr + pid_t * tl.num_programs(1) + pid_f, x_bits)


@triton.jit
def _rht_nvfp4_kernel(
    x_ptr, global_ptr, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr,
    row_global_ptr, row_seed_ptr, row_codes_ptr, row_scales_ptr, row_values_ptr,
    n_tokens, n_features,
    SIGN_MASK: tl.constexpr, ROUNDING: tl.constexpr, DENSE: tl.constexpr,
    ROWWISE: tl.constexpr, ROW_DENSE: tl.constexpr, GROUPS: tl.constexpr, BLOCK_F: tl.constexpr, HW_BF16: tl.constexpr,
):
    """_nvfp4_kernel's steps (1x16 tile) on the transformed tile, written transposed: output row
    f, columns t0 + 16 g + j. With ROWWISE, also NVFP4 1x16 of x itself (rows t, blocks along
    features) from the same tile (RNE or Philox SR from its own seed). ``global_ptr`` /
    ``row_global_ptr``: (amax, s_dec, s_enc / 6) of the transform and of x (global_scales_of)."""
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    t0 = pid_t * GROUPS * 16
    if ROWWISE:
        nvfp4_tile(x_ptr, row_global_ptr, row_seed_ptr, row_seed_ptr, row_codes_ptr, row_scales_ptr, row_values_ptr,
                   t0, pid_f * BLOCK_F, n_tokens, n_features, 1, ROUNDING, ROW_DENSE, GROUPS * 16, BLOCK_F)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = f < n_features
    y, _ = _rht_tokens(x_ptr, t0, f, mask_f, n_features, 16, _RHT16_ENTRY_BITS, SIGN_MASK, GROUPS,
                       BLOCK_F, HW_BF16=HW_BF16)  # [GROUPS, 16, BLOCK_F]

    amax_b = tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1).to(tl.float32, bitcast=True)
    scale_bits, scale, encode = block_scales(amax_b, tl.load(global_ptr + 1), tl.load(global_ptr + 2))
    y = y * encode[:, None, :]  # scales: [GROUPS, BLOCK_F]

    round_and_store_t(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, f, mask_f, t0,
                       n_tokens, ROUNDING, DENSE, GROUPS, 16, BLOCK_F)


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
    scale_bits, scale, inverse = e8m0_scales(amax_b, SCALE_RULE)  # [GROUPS, BLOCK_F]
    y = y * inverse[:, None, :]

    round_and_store_t(y, scale, scale_bits, bits_ptr, seed_ptr, codes_ptr, scales_ptr, values_ptr, f, mask_f, t0,
                       n_tokens, ROUNDING, DENSE, GROUPS, 32, BLOCK_F)


@triton.jit
def _rht_rows_kernel(x_ptr, y_ptr, n_rows, n_cols, D: tl.constexpr, ENTRY_BITS: tl.constexpr,
                     SIGN_MASK: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr):
    """hadamard.rht(x, D) of x [n_rows, n_cols] (n_cols % D == 0) into y: rows r0 .. r0 + BLOCK_R, blocks of D
    columns g0 .. g0 + GROUPS per program; _rht_tokens' arithmetic (each product rounded to FP32, the D
    products summed in index order i, one rounding to x's dtype at the store)."""
    pid_r, pid_g = tl.program_id(0), tl.program_id(1)
    r = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    g = pid_g * GROUPS + tl.arange(0, GROUPS)
    j = tl.arange(0, D)
    mask = (r < n_rows)[:, None, None] & (g < n_cols // D)[None, :, None]  # [BLOCK_R, GROUPS, 1]
    first = r[:, None, None] * n_cols + g[None, :, None] * D  # element 0 of each block
    EXACT_PRODUCTS: tl.constexpr = (D == 16) and (x_ptr.dtype.element_ty != tl.float32)  # as in _rht_tokens
    for i in tl.static_range(D):
        xi = to_fp32(tl.load(x_ptr + first + i, mask=mask, other=0.0))  # [BLOCK_R, GROUPS, 1]: element i of each
        m_i = _rht_matrix_row(i, j, ENTRY_BITS, SIGN_MASK)
        if i == 0:
            acc = xi * m_i[None, None, :]
        elif EXACT_PRODUCTS:
            acc = tl.fma(xi, m_i[None, None, :], acc)  # noqa: F821 (static_range: i == 0 first)
        else:
            acc = acc + xi * m_i[None, None, :]  # noqa: F821
    store_as(y_ptr, first + j[None, None, :], acc, mask & (j < D)[None, None, :])


ROWS_BLOCK_R = 16  # rows per program of ``rows``; 128 columns (128 / D blocks) each


def rows(x: torch.Tensor, d: int, signs: torch.Tensor) -> torch.Tensor:
    """``hadamard.rht(x, d, signs)`` for x [..., n] (n % d == 0, d 16 or 32; float32 / bfloat16 / float16,
    checked by the caller): the same shape, dtype and bits, one pass over x."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    n_rows, n_cols = x2.shape
    groups = max(1, 128 // d)
    grid = (triton.cdiv(n_rows, ROWS_BLOCK_R), triton.cdiv(n_cols // d, groups))
    _rht_rows_kernel[grid](x2, y, n_rows, n_cols, D=d, ENTRY_BITS=_rht_entry_bits(d), SIGN_MASK=sign_mask(signs),
                           BLOCK_R=ROWS_BLOCK_R, GROUPS=groups, **launch_options(x2))
    return y.reshape(shape)


def sign_mask(signs: torch.Tensor) -> int:
    """The d ±1 signs (hadamard.resolve_signs) as a bit mask: bit i set where sign i is -1 (a
    compile-time constant of the kernels: no sign tensor to copy to the device)."""
    return sum(1 << i for i, s in enumerate(signs.tolist()) if s < 0)


def _rht_launch_options(x: torch.Tensor, warps: int) -> dict:
    options = launch_options(x)
    if x.is_cuda:
        options["num_warps"] = warps
    return options


def program_blocks(n_tokens: int, d: int, blocks=None) -> tuple[int, int, int]:
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


def nvfp4_t(
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
    checked by the caller). Outputs as ``nvfp4.quantize`` for the [features, tokens] result; SR bits are
    indexed in that layout (``random_bits`` [features, tokens]). ``blocks``: see ``program_blocks``.

    rowwise=True also quantizes x itself (NVFP4 1x16 along features, as ``nvfp4(x, 1, ...)``) from
    the same reads and returns ``(rowwise outputs, columnwise outputs)``; SR then draws Philox bits
    only, from two seeds (``seeds``: int64 [2], columnwise and rowwise; default drawn from
    ``generator``)."""
    x = x.contiguous()
    n_tokens, n_features = x.shape
    mask = sign_mask(signs)
    groups, block_f, warps = program_blocks(n_tokens, 16, blocks)
    grid = (n_tokens // (groups * 16), triton.cdiv(n_features, block_f))
    partial = torch.empty((2 if rowwise else 1, grid[0] * grid[1]), dtype=torch.int32, device=x.device)
    _rht_abs_max_kernel[grid](x, partial[0], partial[-1], n_features, SIGN_MASK=mask, ROWWISE=rowwise, GROUPS=groups,
                              BLOCK_F=block_f, **_rht_launch_options(x, warps))
    # rows (amax, s_dec, s_enc / 6): the transform's, then x's
    scalars, ((amax, s_dec), *row) = global_scales_of(partial)
    row_amax, row_s_dec = row[0] if row else (amax, s_dec)
    if rowwise and rounding == "sr":
        if random_bits is not None:
            raise ValueError("rht_nvfp4_t: rowwise=True draws Philox bits; random_bits is not supported with it")
        if seeds is None:
            seeds = torch.cat([philox_seed(x, generator), philox_seed(x, generator)])
        mode, bits, seed, row_seed = SR_PHILOX, x, seeds[0:1], seeds[1:2]
    elif seeds is not None and rounding == "sr":
        mode, bits, seed, row_seed = SR_PHILOX, x, seeds[0:1], x
    else:
        (mode, bits, seed), row_seed = rounding_args(x, rounding, random_bits, generator), x
    codes, scales, values = e2m1_outputs((n_features, n_tokens), 16, dense, out_dtype or x.dtype, x.device)
    if rowwise:
        row_codes, row_scales, row_values = e2m1_outputs((n_tokens, n_features), 16, rowwise_dense,
                                                         out_dtype or x.dtype, x.device)
    else:  # the kernel does not touch them (ROWWISE=False): x stands in, nothing is allocated
        row_codes = row_scales = row_values = x
    _rht_nvfp4_kernel[grid](
        x, scalars[0], bits, seed, codes, scales, values,
        scalars[-1], row_seed, row_codes, row_scales, row_values, n_tokens, n_features,
        SIGN_MASK=mask, ROUNDING=mode, DENSE=dense, ROWWISE=rowwise, ROW_DENSE=rowwise_dense, GROUPS=groups,
        BLOCK_F=block_f, HW_BF16=hw_bf16(x), **_rht_launch_options(x, warps),
    )
    columnwise = (values, amax, s_dec) if dense else (codes, scales, amax, s_dec)
    if not rowwise:
        return columnwise
    row = (row_values, row_amax, row_s_dec) if rowwise_dense else (row_codes, row_scales, row_amax, row_s_dec)
    return row, columnwise


def mxfp4_t(
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
    checked by the caller; ``scale_rule`` canonical). Outputs as ``mxfp4.quantize`` for the [features,
    tokens] result: (codes, scale bits), or with dense=True the values in out_dtype. SR bits are
    indexed in that layout (``random_bits`` [features, tokens]), else Philox from ``seed`` or a
    seed drawn from ``generator``. ``blocks``: see ``program_blocks``."""
    x = x.contiguous()
    n_tokens, n_features = x.shape
    groups, block_f, warps = program_blocks(n_tokens, 32, blocks)
    mode, bits, seed = rounding_args(x, rounding, random_bits, generator, seed)
    codes, scales, values = e2m1_outputs((n_features, n_tokens), 32, dense, out_dtype or x.dtype, x.device)
    grid = (n_tokens // (groups * 32), triton.cdiv(n_features, block_f))
    _rht_mxfp4_kernel[grid](
        x, bits, seed, codes, scales, values, n_tokens, n_features,
        SIGN_MASK=sign_mask(signs), SCALE_RULE={"rceil": 0, "floor": 1}[scale_rule], ROUNDING=mode, DENSE=dense,
        GROUPS=groups, BLOCK_F=block_f, HW_BF16=hw_bf16(x), **_rht_launch_options(x, warps),
    )
    return values if dense else (codes, scales)

