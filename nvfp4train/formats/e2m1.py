"""FP4 E2M1: the element format shared by NVFP4 and MXFP4.

Values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; 4-bit code = sign bit (bit 3) | magnitude index (bits 0-2).
Two codes per byte, element 2j in the low nibble and 2j+1 in the high nibble (TE's layout).

Rounding works on already-scaled FP32 values ``y``:
* they are first clamped to [-6, 6] ("satfinite"; NaN stays NaN: see nvfp4.py for NaN policy);
* RNE: ties go to the even code (0, 1, 2, 4), which is exactly torch.round (half-to-even) applied
  on the local grid step (0.5 below 2, 1 below 4, 2 up to 6) — this reproduces TE's decision table;
* SR: round up with probability (|y| - lo) / (hi - lo), from one FP32 uniform per element
  (24 random bits; TE's hardware path uses 8, which is coarser but equally unbiased in the limit).
Sign of zero follows TE: an input that is exactly ±0 encodes as +0, a negative value that rounds
to zero encodes as -0 (code 0x8).
"""

from __future__ import annotations

import torch

from .rounding import uniform_like

E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ROUNDING_MODES = ("rne", "sr")


def check_rounding(rounding: str) -> None:
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding={rounding!r} is not supported; allowed: {ROUNDING_MODES}")


def round_scaled(y: torch.Tensor, rounding: str, generator: torch.Generator | None = None):
    """Round FP32 ``y`` onto the E2M1 grid.

    Returns ``(negative, magnitude)``: a bool tensor (sign bit of the code) and the FP32
    magnitude in {0, .., 6} (NaN where ``y`` is NaN). Both the packed path (codes) and the
    fake-quant path (values) are built from these, so they agree bit for bit.
    """
    y = torch.clamp(y, -E2M1_MAX, E2M1_MAX)
    negative = y < 0
    a = y.abs()
    # Grid spacing of E2M1 around a: 0.5 in [0, 2), 1 in [2, 4), 2 in [4, 6].
    step = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    units = a / step  # exact: step is a power of two
    if rounding == "rne":
        units = torch.round(units)  # half-to-even on the local grid == TE's tie table
    elif rounding == "sr":
        low = torch.floor(units)
        units = low + (uniform_like(a, generator) < (units - low)).to(torch.float32)
    else:
        check_rounding(rounding)
    return negative, units * step


def magnitude_to_index(magnitude: torch.Tensor) -> torch.Tensor:
    """E2M1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6} -> index 0..7 (uint8). NaN -> 0."""
    m = torch.nan_to_num(magnitude, nan=0.0)
    index = torch.where(m < 2.0, m * 2.0, torch.where(m < 4.0, m + 2.0, m * 0.5 + 4.0))
    return index.to(torch.uint8)


def encode(negative: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """4-bit codes (one per uint8) from ``round_scaled``'s output."""
    return magnitude_to_index(magnitude) | (negative.to(torch.uint8) << 3)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., n] 4-bit codes -> [..., n/2] bytes, even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] bytes -> [..., n] 4-bit codes (inverse of ``pack``)."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """4-bit codes -> E2M1 values (code 0x8 decodes to -0.0)."""
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES), dtype=dtype, device=codes.device)
    return table[codes.long()]
