"""MXFP4: E2M1 elements, one power-of-two (E8M0) decode scale per 32 elements, no tensor scale.

Scale rules (``scale_rule``), named as torchao's ``ScaleCalculationMode`` names them:
* "rceil" (default; the paper's App. B.4, TE's reference, and the hardware's
  round-up conversion to E8M0):
  X = 2^ceil(log2(amax_b / 6)), the smallest power of two with 6 * X >= amax_b, so the block amax
  never saturates. torchao calls this RCEIL; its ``CEIL`` is a different rule
  (2^(ceil(log2 amax_b) - 2)) that gives another scale for about 4 blocks in 10.
* "floor" (OCP MX v1.0, torchao FLOOR): X = 2^(floor(log2(amax_b)) - 2); the block amax lands in
  [4, 8) and values above 6 clip to 6.
Exponents are clamped to E8M0's [-127, 127]; an all-zero block gets 2^-127 (as TE's reference).
The rceil exponent is computed exactly from the FP32 bits of amax_b / 6 (TE's reference uses
``ceil(torch.log2(.))``, which can round an amax just above 6 * 2^k down to k and clip; the
golden vectors do not hit that edge and agree).

Elements: ``e2m1(clamp(x / X, -6, 6))`` with RNE or SR. Non-finite: a block holding NaN/±Inf gets
the E8M0 NaN scale (0xFF) and dequantizes to NaN; other blocks are unaffected (no global scale).

``impl``: "reference" (the PyTorch code here), "triton" (kernels/, the same bits; SR from
Philox) or "auto" (Triton for CUDA tensors); see impl.py.

The Wgrad operand (``rht_quantize_t`` / ``rht_fake_quantize_t``): MXFP4 of ``hadamard.rht(x.T, 32)``
for x [tokens, features], from one fused kernel on CUDA that reads x row-major and never
materializes the transpose or the transform.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import e2m1, hadamard
from .impl import use_triton
from .rounding import random_bits_like
from .scale_rules import SCALE_RULES as SCALE_RULES  # the names mxfp4 had before they moved
from .scale_rules import check_scale_rule

BLOCK = 32
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
E8M0_NAN = 255


@dataclass
class MXFP4Tensor:
    """A packed MXFP4 tensor. ``shape`` is the logical shape ``[..., cols]``."""

    codes: torch.Tensor  # uint8 [..., cols // 2], element 2j in the low nibble
    scales: torch.Tensor  # float8_e8m0fnu [..., cols // 32]; .to(torch.float32) gives 2^e
    shape: torch.Size
    scale_rule: str

    @property
    def global_decode_scale(self) -> torch.Tensor:
        return torch.ones((), dtype=torch.float32, device=self.codes.device)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + self.scales.numel()

    def unpacked_codes(self) -> torch.Tensor:
        return e2m1.unpack(self.codes)

    def dequantize(
        self, dtype: torch.dtype = torch.float32, apply_global_scale: bool = True, *, impl: str = "auto"
    ) -> torch.Tensor:
        """Decode to ``dtype`` (``apply_global_scale`` is accepted for symmetry; there is none). On CUDA
        one Triton pass (the same bits)."""
        if use_triton(self.codes, impl, "mxfp4.MXFP4Tensor.dequantize"):
            from . import kernels

            return kernels.dequant.e2m1(self.codes, self.scales, None, self.shape, BLOCK, e8m0=True, dtype=dtype)
        # Undo decode_scaled's 2^-14 first (folding it into 2^e could overflow for e > 113).
        values = e2m1.decode_scaled(self.codes).to(torch.float32).mul_(1.0 / e2m1.FP16_FROM_E2M1)
        values = values.unflatten(-1, (-1, BLOCK)).mul_(scale_from_e8m0(self.scales).unsqueeze(-1))
        return values.flatten(-2).to(dtype)


def scale_from_e8m0(scales: torch.Tensor) -> torch.Tensor:
    """float8_e8m0fnu (or its uint8 bits) -> FP32 2^(bits - 127); 0xFF -> NaN."""
    bits = scales.view(torch.uint8).to(torch.int32)
    normal = torch.bitwise_left_shift(bits.clamp(min=1), 23).view(torch.float32)  # 2^(bits-127)
    value = torch.where(bits == 0, torch.full_like(normal, 2.0**-127), normal)
    return torch.where(bits == E8M0_NAN, torch.full_like(value, float("nan")), value)


def scale_exponent(block_amax: torch.Tensor, scale_rule: str) -> torch.Tensor:
    """Unbiased E8M0 exponent (int32, in [-127, 127]) of each block's decode scale."""
    scale_rule = check_scale_rule(scale_rule)
    if scale_rule == "rceil":
        v = block_amax / e2m1.E2M1_MAX
        mantissa, exponent = torch.frexp(v)  # v = mantissa * 2^exponent, mantissa in [0.5, 1)
        e = exponent - (mantissa == 0.5).to(exponent.dtype)  # exact ceil(log2 v)
        # An amax_b below 6 * 2^-150 gives v = 0, whose frexp exponent 0 would mean scale 1:
        # ceil(log2 0) = -inf, clamped to -127 (TE's reference: ceil(log2(.)) then clamp).
        e = torch.where(v == 0, torch.full_like(e, -127), e)
    else:  # floor
        _, exponent = torch.frexp(block_amax)
        e = exponent - 1 - 2  # floor(log2 amax) - emax(E2M1)
    e = torch.where(block_amax == 0, torch.full_like(e, -127), e)
    return e.to(torch.int32).clamp(-127, 127)


def _check(x: torch.Tensor, rounding: str, scale_rule: str) -> str:
    """Check the arguments; the canonical scale rule."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"mxfp4: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"mxfp4: x.dtype={x.dtype} is not supported; allowed: {INPUT_DTYPES}")
    if x.ndim == 0 or x.numel() == 0 or x.shape[-1] % BLOCK != 0:
        raise ValueError(
            f"mxfp4: the last dim of shape {tuple(x.shape)} must be a non-zero multiple of {BLOCK} (no padding is done)"
        )
    e2m1.check_rounding(rounding)
    return check_scale_rule(scale_rule)


def _draw_random_bits(x: torch.Tensor, rounding: str, generator):
    return random_bits_like(x, generator) if rounding == "sr" else None


def _quantize_core(x: torch.Tensor, rounding: str, scale_rule: str, random_bits):
    """(values [rows, nb, 32] FP32 signed E2M1 values, scale bits uint8 [rows, nb], scale FP32)."""
    cols = x.shape[-1]
    rows, nb = x.numel() // cols, cols // BLOCK
    # Two FP32 scratch tensors: y (x, scaled and rounded in place) and |x| (then the magnitudes).
    y = x.reshape(rows, cols).to(torch.float32, copy=True)  # exact for bf16/fp16
    magnitude = y.abs()
    # max_pool1d (kernel = stride = 32) is the blocks' max, faster on CPU than amax(dim=-1);
    # NaN propagates.
    block_amax = torch.nn.functional.max_pool1d(magnitude.view(rows, 1, cols), BLOCK, BLOCK).view(rows, nb)
    finite = torch.isfinite(block_amax)
    bits = (scale_exponent(torch.where(finite, block_amax, 0.0), scale_rule) + 127).to(torch.uint8)
    bits = torch.where(finite, bits, torch.full_like(bits, E8M0_NAN))
    scale = scale_from_e8m0(bits)
    y = y.view(rows, nb, BLOCK).mul_(torch.reciprocal(scale).unsqueeze(-1))  # 1/2^e: exact
    scratch = magnitude.view(rows, nb, BLOCK)
    values = e2m1.round_signed_(y, rounding, scratch=scratch, random_bits=random_bits)
    return values, bits, scale


def _quantize_impl(x: torch.Tensor, rounding: str, scale_rule: str, random_bits):
    """Packed codes [..., cols/2] and scale bits [..., cols/32]."""
    values, bits, _ = _quantize_core(x, rounding, scale_rule, random_bits)
    lead = x.shape[:-1]
    codes = e2m1.pack(e2m1.encode_values(values).flatten(-2))
    return codes.reshape(*lead, -1), bits.reshape(*lead, -1)


def _fake_quantize_impl(x: torch.Tensor, rounding: str, scale_rule: str, random_bits, out_dtype: torch.dtype):
    """e2m1 * 2^e in out_dtype."""
    values, _, scale = _quantize_core(x, rounding, scale_rule, random_bits)
    values.mul_(scale.unsqueeze(-1))  # e2m1 * 2^e: exact in FP32 and bf16
    return values.view(x.shape).to(out_dtype)


def quantize(
    x: torch.Tensor,
    rounding: str = "rne",
    scale_rule: str = "rceil",
    generator: torch.Generator | None = None,
    *,
    impl: str = "auto",
) -> MXFP4Tensor:
    """Quantize ``x`` (blocks of 32 along dim -1) to packed MXFP4."""
    scale_rule = _check(x, rounding, scale_rule)
    if use_triton(x, impl, "mxfp4.quantize"):
        from . import kernels

        codes, bits = kernels.mxfp4.quantize(x, scale_rule, rounding, dense=False, generator=generator)
    else:
        codes, bits = _quantize_impl(x, rounding, scale_rule, _draw_random_bits(x, rounding, generator))
    return MXFP4Tensor(
        codes=codes,
        scales=bits.view(torch.float8_e8m0fnu),
        shape=x.shape,
        scale_rule=scale_rule,
    )


def fake_quantize(
    x: torch.Tensor,
    rounding: str = "rne",
    scale_rule: str = "rceil",
    generator: torch.Generator | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    impl: str = "auto",
):
    """``(values, 1.0)``: dequantized MXFP4 values in ``out_dtype`` (default x.dtype), equal bit
    for bit to ``quantize(...).dequantize(out_dtype)``. Exact in bf16 (E2M1 x 2^e)."""
    scale_rule = _check(x, rounding, scale_rule)
    if use_triton(x, impl, "mxfp4.fake_quantize"):
        from . import kernels

        values = kernels.mxfp4.quantize(
            x, scale_rule, rounding, dense=True, generator=generator, out_dtype=out_dtype or x.dtype
        )
    else:
        random_bits = _draw_random_bits(x, rounding, generator)
        values = _fake_quantize_impl(x, rounding, scale_rule, random_bits, out_dtype or x.dtype)
    return values, torch.ones((), dtype=torch.float32, device=x.device)


# ------------------------------------------------------------------------------ Wgrad operand
def rht_quantize_t(
    x: torch.Tensor,
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    signs=None,
    scale_rule: str = "rceil",
    *,
    impl: str = "auto",
    blocks: tuple[int, ...] | None = None,
) -> MXFP4Tensor:
    """The Wgrad operand of ``x`` [tokens, features]: MXFP4 (1x32) of ``hadamard.rht(x.T, 32,
    signs)``, shape [features, tokens].

    Same bits as ``quantize(hadamard.rht(x.t().contiguous(), 32, signs), rounding, scale_rule,
    generator)`` (which is what impl="reference" runs); the Triton kernel reads x row-major and
    never materializes the transpose or the transform. SR bits follow the [features, tokens]
    layout. ``blocks``: the Triton kernel's (groups of 32 tokens, features[, warps]) per program
    (kernels.rht.program_blocks; a speed knob, the bits do not depend on it)."""
    signs = e2m1.check_wgrad_args(x, BLOCK, rounding, signs, "mxfp4.rht_quantize_t")
    scale_rule = check_scale_rule(scale_rule)
    if not use_triton(x, impl, "mxfp4.rht_quantize_t"):
        return quantize(
            hadamard.rht(x.t().contiguous(), BLOCK, signs, "reference"),
            rounding,
            scale_rule,
            generator,
            impl="reference",
        )
    from . import kernels

    codes, bits = kernels.rht.mxfp4_t(x, signs, scale_rule, rounding, dense=False, generator=generator, blocks=blocks)
    return MXFP4Tensor(codes, bits.view(torch.float8_e8m0fnu), torch.Size(x.shape[::-1]), scale_rule)


def rht_fake_quantize_t(
    x: torch.Tensor,
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    signs=None,
    scale_rule: str = "rceil",
    out_dtype: torch.dtype | None = None,
    *,
    impl: str = "auto",
    blocks: tuple[int, ...] | None = None,
):
    """``(values [features, tokens], 1.0)``: ``fake_quantize`` of ``hadamard.rht(x.T, 32, signs)``
    (see ``rht_quantize_t``)."""
    signs = e2m1.check_wgrad_args(x, BLOCK, rounding, signs, "mxfp4.rht_fake_quantize_t")
    scale_rule = check_scale_rule(scale_rule)
    if not use_triton(x, impl, "mxfp4.rht_fake_quantize_t"):
        return fake_quantize(
            hadamard.rht(x.t().contiguous(), BLOCK, signs, "reference"),
            rounding,
            scale_rule,
            generator,
            out_dtype,
            impl="reference",
        )
    from . import kernels

    values = kernels.rht.mxfp4_t(
        x, signs, scale_rule, rounding, dense=True, generator=generator, out_dtype=out_dtype or x.dtype, blocks=blocks
    )
    return values, torch.ones((), dtype=torch.float32, device=x.device)
