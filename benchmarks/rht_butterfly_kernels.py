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
