"""FP4 E2M1: the element format shared by NVFP4 and MXFP4.

Values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; 4-bit code = sign bit (bit 3) | magnitude index (bits 0-2).
Two codes per byte, element 2j in the low nibble and 2j+1 in the high nibble (TE's layout).

Rounding works on already-scaled FP32 values ``y``:
* they are first clamped to [-6, 6] ("satfinite"; NaN stays NaN: see nvfp4.py for NaN policy);
* RNE: ties go to the even code (0, 1, 2, 4), i.e. half-to-even on the local grid step (0.5 below
  2, 1 below 4, 2 up to 6) — this reproduces TE's decision table;
* SR: round up with probability floor(256 f) / 256, f = (|y| - lo) / (hi - lo) (to 2^-21 of the
  step): 8 random bits per element, the definition of TE's ``cvt.rs.satfinite.e2m1x4.f32`` and of
  its software fallback (t = |y| + u step, u = r8 / 256, floored onto the grid). Biased towards
  zero by less than 1/256 of a step, as TE's hardware (see ``round_signed_``).
Sign of zero follows TE: an input that is exactly ±0 encodes as +0, a negative value that rounds
to zero encodes as -0 (code 0x8).

Speed: every function here is a handful of full-tensor passes with no ``torch.where`` (slow on
CPU) and no Python loops; the tricks are exact and explained where they are used.
"""

from __future__ import annotations

import torch

from . import hadamard
from .rounding import random_bits_like

E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ROUNDING_MODES = ("rne", "sr")

_EXPONENT_BITS = 0x7F800000  # FP32 exponent field
_SR_DROPPED_BITS = (1 << 21) - 1  # see round_signed_: the bits below the E2M1 step
SR_RANDOM_BITS = 8  # random bits per element SR uses: the low byte of each random word
_SR_SHIFT = 21 - SR_RANDOM_BITS  # the byte is added to the top 8 of the 21 dropped bits
# An E2M1 value r, scaled by 2^-14, is an exact float16 whose bits are sign << 15 | index << 9:
# FP16's smallest normal 2^-14 lines up with E2M1's smallest normal 1, E2M1's mantissa bit with
# FP16's top mantissa bit, and 0.5 lands on FP16's subnormal 2^-15 (bits 0x0200, index 1).
# FP32 <-> FP16 casts are exact for these values and vectorized on CPU (unlike float8 casts).
FP16_FROM_E2M1 = 2.0**-14


def check_rounding(rounding: str) -> None:
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding={rounding!r} is not supported; allowed: {ROUNDING_MODES}")


def check_wgrad_args(x: torch.Tensor, block: int, rounding: str, signs, who: str) -> torch.Tensor:
    """The checks of a fused Wgrad quantizer ``who`` (the RHT along x's tokens, then ``block``-element E2M1
    blocks): x's dtype and shape, the rounding mode; returns the sign vector ``signs`` stands for."""
    hadamard.check_wgrad_input(x, block, who)
    check_rounding(rounding)
    return hadamard.resolve_signs(block, signs)


def round_signed_(
    y: torch.Tensor,
    rounding: str,
    generator: torch.Generator | None = None,
    scratch: torch.Tensor | None = None,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round FP32 ``y`` onto the signed E2M1 grid, in place; returns ``y``.

    |y| > 6 saturates to ±6, NaN stays NaN. A negative value that rounds to 0 gives -0.0 and an
    input ±0 gives +0.0 (the codes' sign rule), so ``encode_values`` of the result gives TE's
    codes. ``scratch``: an optional FP32 tensor of y's shape to work in (saves an allocation; its
    contents are lost). SR uses ``random_bits`` (int32, y's shape, from
    ``rounding.random_bits_like``; only the low 8 bits of each word are used) if given, else draws
    them from ``generator``.
    """
    check_rounding(rounding)
    y.add_(0.0)  # IEEE: -0.0 + 0.0 = +0.0, so only strictly negative values keep their sign bit
    y.clamp_(-E2M1_MAX, E2M1_MAX)
    # offset = ±max(2^floor(log2|y|), 1) with y's sign: the binade of |y| on the E2M1 grid, whose
    # step is |offset| / 2 (0.5 below 2, 1 in [2, 4), 2 in [4, 6]). Masking sign and mantissa off
    # y's bits leaves exactly 2^floor(log2|y|) (0 for |y| < 2^-126; +Inf for NaN, so NaN stays NaN).
    offset = torch.empty_like(y) if scratch is None else scratch
    torch.bitwise_and(y.view(torch.int32), _EXPONENT_BITS, out=offset.view(torch.int32))
    offset.clamp_(min=1.0).copysign_(y)
    # Every step below is mirror-symmetric in the sign (FP32 rounding is), so it works on |y|.
    if rounding == "rne":
        # |y| + 2^22 |offset| lies in [2^22, 2^23) * |offset|, where consecutive FP32 numbers are
        # |offset| / 2 apart — exactly the E2M1 step. So the FP32 addition itself rounds y onto
        # the grid, half-to-even on the step count (= ties to the even code); subtracting the
        # offset back is exact. (2^22 * offset is a power of two: exact whether or not fused.)
        y.add_(offset, alpha=2.0**22).sub_(offset, alpha=2.0**22)
    else:
        # SR: |z| = |y| + 2 |offset| lies in [2, 4) * |offset|, an FP32 binade in which the E2M1
        # step is the weight of mantissa bit 21 (this addition rounds y to 2^-21 of a step, RNE).
        # A random byte r is added to the top 8 of the 21 bits below the step (z's bits are the
        # magnitude part of sign-magnitude) and the 21 bits are cleared: it carries into the kept
        # bits iff r >= 256 - dropped / 2^13, i.e. with probability floor(256 f) / 256 for the
        # fraction f = dropped / 2^21 = (|y| - lo) / step. That is TE's 8-bit SR (cvt.rs, and its
        # fallback's floor(|y| + (r / 256) step)): biased towards zero by less than 1/256 of a
        # step (the dropped bits below the byte never carry), where 21 random bits would be exact.
        # A carry out of the mantissa moves z into the next binade, which is the next grid point.
        y.add_(offset, alpha=2.0)
        if random_bits is None:
            random_bits = random_bits_like(y, generator)
        bits = y.view(torch.int32)
        bits.add_((random_bits.view(y.shape) & 0xFF).bitwise_left_shift_(_SR_SHIFT))
        bits.bitwise_and_(~_SR_DROPPED_BITS)
        y.sub_(offset, alpha=2.0)
        # A NaN whose payload is all ones (what a GPU writes) carries the byte into its sign bit and
        # comes out finite or infinite; only NaN has an infinite offset (|y| was clamped to 6).
        y.masked_fill_(offset.isinf(), float("nan"))
    # x - x is +0 in IEEE: give zeros that came from negative values their sign back.
    return y.copysign_(offset)


def round_magnitude_(
    a: torch.Tensor,
    rounding: str,
    generator: torch.Generator | None = None,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round FP32 magnitudes ``a`` (>= 0 or NaN) onto {0, .5, 1, 1.5, 2, 3, 4, 6}, in place;
    returns ``a`` (see ``round_signed_``)."""
    return round_signed_(a, rounding, generator, random_bits=random_bits)


def round_scaled(y: torch.Tensor, rounding: str, generator: torch.Generator | None = None):
    """Round FP32 ``y`` onto the E2M1 grid (``y`` is not modified).

    Returns ``(negative, magnitude)``: a bool tensor (sign bit of the code) and the FP32
    magnitude in {0, .., 6} (NaN where ``y`` is NaN).
    """
    magnitude = round_magnitude_(y.to(torch.float32).abs(), rounding, generator)
    return y < 0, magnitude


def encode_values(values: torch.Tensor) -> torch.Tensor:
    """4-bit codes (one per uint8) of FP32 E2M1 values (``round_signed_``'s output); NaN -> 0."""
    bits = values.mul(FP16_FROM_E2M1).nan_to_num_(0.0).to(torch.float16).view(torch.int16)
    # bits = sign << 15 | index << 9 (see FP16_FROM_E2M1); >> is arithmetic, the masks drop the rest
    codes = (bits >> 9).bitwise_and_(0x7).bitwise_or_((bits >> 12).bitwise_and_(0x8))
    return codes.to(torch.uint8)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., n] 4-bit codes -> [..., n/2] bytes, even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] bytes -> [..., n] 4-bit codes (inverse of ``pack``)."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def fp16_bits(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes -> int16 bits of the FP16 numbers e2m1 * 2^-14 (see FP16_FROM_E2M1)."""
    c = codes.to(torch.int16)
    return ((c & 0x7) << 9).bitwise_or_((c & 0x8) << 12)


def decode_scaled(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] packed bytes -> FP16 [..., n] holding e2m1 * 2^-14 (exact; code 0x8 is -0.0).

    Multiply by (scale * 2^14) in FP32 to get e2m1 * scale exactly (both factors are exact and
    their product is the exact e2m1 * scale)."""
    c = packed.to(torch.int16)
    low = ((c & 0x07) << 9).bitwise_or_((c & 0x08) << 12)  # even element: bits 0-3
    high = ((c & 0x70) << 5).bitwise_or_((c & 0x80) << 8)  # odd element: bits 4-7
    return torch.stack((low, high), dim=-1).flatten(-2).view(torch.float16)


def decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """4-bit codes -> E2M1 values (code 0x8 decodes to -0.0)."""
    values = fp16_bits(codes).view(torch.float16).to(torch.float32).mul_(1.0 / FP16_FROM_E2M1)
    return values.to(dtype)
