"""Rounding modes as the kernels' constexpr, and stochastic rounding's random bits (Philox bytes as TE's
cvt.rs draws them); mirrors ``formats/rounding.py``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Rounding modes as the kernels' constexpr.
RNE, SR_BITS, SR_PHILOX = 0, 1, 2


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
def philox_rows(seed_ptr, first, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """SR's random bytes (int32, low 8 bits) for a [BLOCK_R, BLOCK_C] tile whose element (i, k) has
    the flat output index first[i] + k (first: [BLOCK_R] int64, a multiple of 16; BLOCK_C too).
    One Philox call (randint4x: 4 words) serves 16 elements, 8 bits each, as TE's cvt.rs uses: the
    element of index n takes byte n % 4 of word (n // 4) % 4 of counter n // 16, so its bits depend
    on the index only, not on the tiling (e2m1.random_bits_t draws through it for the Wgrad kernels'
    transposed tiles: the bytes of the materialized operand)."""
    tl.static_assert(BLOCK_C % 16 == 0, "Philox SR draws whole 16-element counters")
    counter = (first[:, None] // 16 + tl.arange(0, BLOCK_C // 16)[None, :]).to(tl.int32)
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed_ptr), counter)
    return tl.reshape(_philox_bytes(r0, r1, r2, r3), (BLOCK_R, BLOCK_C))


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
