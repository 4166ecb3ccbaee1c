"""The kernels of benchmarks/bench_rht_butterfly.py (imported after it sets TRITON_INTERPRET for --device cpu):
x [tokens, features] -> [features, tokens], a program taking GROUPS groups of 16 tokens x BLOCK_F features."""

import triton
import triton.language as tl

from nvfp4train.formats.kernels.common import round_to, store_as, to_fp32
from nvfp4train.formats.kernels.rht import _RHT16_ENTRY_BITS, _rht_tokens


@triton.jit
def _tile_offsets(pid_t, pid_f, n_tokens, n_features, GROUPS: tl.constexpr, BLOCK_F: tl.constexpr):
    """[GROUPS, 16, BLOCK_F] offsets of x (row-major [tokens, features]) and of its transpose, and the mask."""
    g = tl.arange(0, GROUPS)[:, None, None]
    j = tl.arange(0, 16)[None, :, None]
    f = (pid_f * BLOCK_F + tl.arange(0, BLOCK_F))[None, None, :]
    t = (pid_t * GROUPS * 16 + g * 16 + j).to(tl.int64)
    return t * n_features + f, f.to(tl.int64) * n_tokens + t, (f < n_features) & (t < n_tokens)


@triton.jit
def index_order(
    x_ptr,
    y_ptr,
    n_tokens,
    n_features,
    SIGN_MASK: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HW_BF16: tl.constexpr,
):
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    y, _ = _rht_tokens(
        x_ptr,
        pid_t * GROUPS * 16,
        f,
        f < n_features,
        n_features,
        16,
        _RHT16_ENTRY_BITS,
        SIGN_MASK,
        GROUPS,
        BLOCK_F,
        HW_BF16=HW_BF16,
    )
    _, out, mask = _tile_offsets(pid_t, pid_f, n_tokens, n_features, GROUPS, BLOCK_F)
    store_as(y_ptr, out, y, mask)


@triton.jit
def _butterfly_stage(y, GROUPS: tl.constexpr, H: tl.constexpr, BLOCK_F: tl.constexpr):
    """(y_j, y_{j+H}) -> (y_j + y_{j+H}, y_j - y_{j+H}) along axis 1 of [GROUPS, 16, BLOCK_F], j in
    blocks of 2H."""
    y = tl.reshape(y, (GROUPS, 16 // (2 * H), 2, H, BLOCK_F))
    a, b = tl.split(tl.permute(y, (0, 1, 3, 4, 2)))
    y = tl.permute(tl.join(a + b, a - b), (0, 1, 4, 2, 3))
    return tl.reshape(y, (GROUPS, 16, BLOCK_F))


@triton.jit
def butterfly(
    x_ptr,
    y_ptr,
    n_tokens,
    n_features,
    SIGN_MASK: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HW_BF16: tl.constexpr,
):
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    src, out, mask = _tile_offsets(pid_t, pid_f, n_tokens, n_features, GROUPS, BLOCK_F)
    x = to_fp32(tl.load(x_ptr + src, mask=mask, other=0.0))
    j = tl.arange(0, 16)
    negative = (SIGN_MASK >> j) & 1
    scale = ((negative << 31) | 0x3E800000).to(tl.float32, bitcast=True)  # ±1/4: exact products
    y = x * scale[None, :, None]
    y = _butterfly_stage(y, GROUPS, 1, BLOCK_F)
    y = _butterfly_stage(y, GROUPS, 2, BLOCK_F)
    y = _butterfly_stage(y, GROUPS, 4, BLOCK_F)
    y = _butterfly_stage(y, GROUPS, 8, BLOCK_F)
    store_as(y_ptr, out, round_to(y, x_ptr.dtype.element_ty, HW_BF16), mask)


@triton.jit
def transposing_copy(
    x_ptr,
    y_ptr,
    n_tokens,
    n_features,
    SIGN_MASK: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HW_BF16: tl.constexpr,
):
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    src, out, mask = _tile_offsets(pid_t, pid_f, n_tokens, n_features, GROUPS, BLOCK_F)
    tl.store(y_ptr + out, tl.load(x_ptr + src, mask=mask), mask=mask)


@triton.jit
def _signed_quarter(first, i: tl.constexpr, n_features, mask_f, SIGN_MASK: tl.constexpr):
    """Token i of each group as FP32 times s_i / 4 (exact for a 16-bit input): [GROUPS, 1, BLOCK_F]."""
    xi = to_fp32(tl.load(first + i * n_features, mask=mask_f[None, None, :], other=0.0))
    scale: tl.constexpr = -0.25 if (SIGN_MASK >> i) & 1 else 0.25
    return xi * scale


@triton.jit
def _pair(a, b):
    return a + b, a - b


@triton.jit
def register_butterfly(
    x_ptr,
    y_ptr,
    n_tokens,
    n_features,
    SIGN_MASK: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HW_BF16: tl.constexpr,
):
    """``butterfly``'s arithmetic on the 16 tokens loaded one by one as ``_rht_tokens`` loads them (a
    thread holds all 16 of its group and feature), each stage on named registers: no reshapes."""
    pid_t, pid_f = tl.program_id(0), tl.program_id(1)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = f < n_features
    g = tl.arange(0, GROUPS)
    t0 = pid_t * GROUPS * 16
    first = x_ptr + ((t0 + g * 16).to(tl.int64)[:, None, None] * n_features + f[None, None, :])
    x0 = _signed_quarter(first, 0, n_features, mask_f, SIGN_MASK)
    x1 = _signed_quarter(first, 1, n_features, mask_f, SIGN_MASK)
    x2 = _signed_quarter(first, 2, n_features, mask_f, SIGN_MASK)
    x3 = _signed_quarter(first, 3, n_features, mask_f, SIGN_MASK)
    x4 = _signed_quarter(first, 4, n_features, mask_f, SIGN_MASK)
    x5 = _signed_quarter(first, 5, n_features, mask_f, SIGN_MASK)
    x6 = _signed_quarter(first, 6, n_features, mask_f, SIGN_MASK)
    x7 = _signed_quarter(first, 7, n_features, mask_f, SIGN_MASK)
    x8 = _signed_quarter(first, 8, n_features, mask_f, SIGN_MASK)
    x9 = _signed_quarter(first, 9, n_features, mask_f, SIGN_MASK)
    x10 = _signed_quarter(first, 10, n_features, mask_f, SIGN_MASK)
    x11 = _signed_quarter(first, 11, n_features, mask_f, SIGN_MASK)
    x12 = _signed_quarter(first, 12, n_features, mask_f, SIGN_MASK)
    x13 = _signed_quarter(first, 13, n_features, mask_f, SIGN_MASK)
    x14 = _signed_quarter(first, 14, n_features, mask_f, SIGN_MASK)
    x15 = _signed_quarter(first, 15, n_features, mask_f, SIGN_MASK)
    # h = 1, 2, 4, 8: pairs (j, j + h)
    x0, x1 = _pair(x0, x1)
    x2, x3 = _pair(x2, x3)
    x4, x5 = _pair(x4, x5)
    x6, x7 = _pair(x6, x7)
    x8, x9 = _pair(x8, x9)
    x10, x11 = _pair(x10, x11)
    x12, x13 = _pair(x12, x13)
    x14, x15 = _pair(x14, x15)
    x0, x2 = _pair(x0, x2)
    x1, x3 = _pair(x1, x3)
    x4, x6 = _pair(x4, x6)
    x5, x7 = _pair(x5, x7)
    x8, x10 = _pair(x8, x10)
    x9, x11 = _pair(x9, x11)
    x12, x14 = _pair(x12, x14)
    x13, x15 = _pair(x13, x15)
    x0, x4 = _pair(x0, x4)
    x1, x5 = _pair(x1, x5)
    x2, x6 = _pair(x2, x6)
    x3, x7 = _pair(x3, x7)
    x8, x12 = _pair(x8, x12)
    x9, x13 = _pair(x9, x13)
    x10, x14 = _pair(x10, x14)
    x11, x15 = _pair(x11, x15)
    x0, x8 = _pair(x0, x8)
    x1, x9 = _pair(x1, x9)
    x2, x10 = _pair(x2, x10)
    x3, x11 = _pair(x3, x11)
    x4, x12 = _pair(x4, x12)
    x5, x13 = _pair(x5, x13)
    x6, x14 = _pair(x6, x14)
    x7, x15 = _pair(x7, x15)
    # back into one [GROUPS, 16, BLOCK_F] tile: a thread's j are compile-time constants, so the selects fold away
    j = tl.arange(0, 16)[None, :, None]
    y = tl.where(j == 0, x0, x1)
    y = tl.where(j == 2, x2, y)
    y = tl.where(j == 3, x3, y)
    y = tl.where(j == 4, x4, y)
    y = tl.where(j == 5, x5, y)
    y = tl.where(j == 6, x6, y)
    y = tl.where(j == 7, x7, y)
    y = tl.where(j == 8, x8, y)
    y = tl.where(j == 9, x9, y)
    y = tl.where(j == 10, x10, y)
    y = tl.where(j == 11, x11, y)
    y = tl.where(j == 12, x12, y)
    y = tl.where(j == 13, x13, y)
    y = tl.where(j == 14, x14, y)
    y = tl.where(j == 15, x15, y)
    _, out, mask = _tile_offsets(pid_t, pid_f, n_tokens, n_features, GROUPS, BLOCK_F)
    store_as(y_ptr, out, round_to(y, x_ptr.dtype.element_ty, HW_BF16), mask)
