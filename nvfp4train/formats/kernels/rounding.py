"""Rounding modes as the kernels' constexpr, and stochastic rounding's random bits (Philox bytes as TE's
cvt.rs draws them); mirrors ``formats/rounding.py``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import INTERPRETED

# Rounding modes as the kernels' constexpr.
RNE, SR_BITS, SR_PHILOX = 0, 1, 2


# On the GPU, SR's byte extraction is one PRMT (a byte permute: byte K into byte 0, zeros above) whose
# result the compiler cannot fold into the shift that follows, so the shift and round_e2m1's addition
# become one LEA: 2 instructions an element, where the shift-and-mask form takes 3 (LLVM turns
# ((w >> 8K) & 0xFF) << 13 into a shift then a mask, which ptxas does not fuse with the add). The
# interpreter, which runs no inline assembly, keeps the arithmetic: the same value.
_PRMT = tl.constexpr(not INTERPRETED)


@triton.jit
def _byte_at(words, K: tl.constexpr, SHIFT: tl.constexpr):
    """Byte K of int32 ``words`` on bits SHIFT .. SHIFT + 7, the rest clear: ((words >> 8 K) & 0xFF) <<
    SHIFT (interpreter: one shift and one mask, an arithmetic shift right only filling bits the mask
    clears; GPU: prmt.b32 with selector 0x4440 + K, byte K of words into byte 0 and byte 0 of the zero
    operand into bytes 1..3, then the shift)."""
    if _PRMT:
        if K == 0:
            byte = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4440;", "=r,r", [words], dtype=tl.int32,
                                             is_pure=True, pack=1)
        elif K == 1:
            byte = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4441;", "=r,r", [words], dtype=tl.int32,
                                             is_pure=True, pack=1)
        elif K == 2:
            byte = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4442;", "=r,r", [words], dtype=tl.int32,
                                             is_pure=True, pack=1)
        else:
            byte = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4443;", "=r,r", [words], dtype=tl.int32,
                                             is_pure=True, pack=1)
        return byte << SHIFT
    elif 8 * K >= SHIFT:
        return (words >> (8 * K - SHIFT)) & (tl.constexpr(0xFF) << SHIFT)
    else:
        return (words << (SHIFT - 8 * K)) & (tl.constexpr(0xFF) << SHIFT)


@triton.jit
def _philox_bytes(r0, r1, r2, r3, SHIFT: tl.constexpr = 0):
    """The 16 random bytes of one Philox call (randint4x's words r0..r3, any shape S), as int32 on
    bits SHIFT .. SHIFT + 7, shape S + (2, 2, 2, 2): flattened, element k of the 16 takes byte k % 4
    (bits 8 (k % 4) .. + 7) of word k // 4."""
    # join(join(a, c), join(b, d))[.., i, h] = (a, b, c, d)[2 i + h]: four tensors interleaved.
    words = tl.join(tl.join(r0, r2), tl.join(r1, r3)).to(tl.int32, bitcast=True)
    b0, b1 = _byte_at(words, 0, SHIFT), _byte_at(words, 1, SHIFT)
    b2, b3 = _byte_at(words, 2, SHIFT), _byte_at(words, 3, SHIFT)
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@triton.jit
def philox_rows(seed_ptr, first, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SHIFT: tl.constexpr = 0):
    """SR's random bytes (int32 on bits SHIFT .. SHIFT + 7, the rest clear: SHIFT 13 is e2m1.round_e2m1's
    addend) for a [BLOCK_R, BLOCK_C] tile whose element (i, k) has
    the flat output index first[i] + k (first: [BLOCK_R] int64, a multiple of 16; BLOCK_C too).
    One Philox call (randint4x: 4 words) serves 16 elements, 8 bits each, as TE's cvt.rs uses: the
    element of index n takes byte n % 4 of word (n // 4) % 4 of counter n // 16, so its bits depend
    on the index only, not on the tiling (e2m1.random_bits_t draws through it for the Wgrad kernels'
    transposed tiles: the bytes of the materialized operand)."""
    tl.static_assert(BLOCK_C % 16 == 0, "Philox SR draws whole 16-element counters")
    counter = (first[:, None] // 16 + tl.arange(0, BLOCK_C // 16)[None, :]).to(tl.int32)
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed_ptr), counter)
    return tl.reshape(_philox_bytes(r0, r1, r2, r3, SHIFT), (BLOCK_R, BLOCK_C))


def philox_seed(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A 1-element int64 seed for the kernels' Philox stream, drawn on x's device from
    ``generator`` (torch's default for that device when None): no host sync, and the generator
    advances, so successive calls draw different bits."""
    from ..rounding import _check_generator_device

    _check_generator_device(x, generator)
    return torch.randint(0, 2**62, (1,), generator=generator, device=x.device, dtype=torch.int64)


def rounding_args(x, rounding: str, random_bits, generator, seed=None):
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
