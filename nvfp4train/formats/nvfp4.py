"""NVFP4: E2M1 elements, one E4M3 decode scale per 16 elements, one FP32 scale per tensor.

Bit-exact with Transformer Engine's reference quantizer (arXiv 2509.25149 App. B; TE's
`transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`; tests/formats/golden/):

    amax     = max|x|                                       (FP32, whole tensor)
    s_enc    = 2688 / amax  (true FP32 division; min FLT_MAX; 1 if amax == 0)
    s_dec    = 1 / s_enc                                    (``global_decode_scale``)
    scale_b  = e4m3_rne( min(amax_b * (s_enc * fp32(1/6)), 448) )    (stored block scale)
    enc_b    = min(1 / (fp32(scale_b) * s_dec), FLT_MAX)    (from the *quantized* scale)
    code_i   = e2m1( clamp(x_i * enc_b, -6, 6) )            (RNE, or SR for gradients)
    x_hat_i  = e2m1(code_i) * fp32(scale_b) * s_dec

Tiles: (1, 16) gives one scale per 16 consecutive elements of the last dim (activations and
gradients); (16, 16) gives one scale per 16x16 tile, stored repeated on each of its 16 rows, so
``quantize(w, (16, 16))`` and ``quantize(w.T, (16, 16))`` hold transposed copies of the same
numbers (weights: Fprop and Dgrad see one quantized W). Shapes the tile does not divide are an
error (no padding).

Non-finite input (policy, deliberately unlike hardware satfinite, which turns NaN into +6): if any
element of ``x`` is NaN or ±Inf, ``amax`` records it (NaN or Inf), the global scales become NaN and
every block scale is E4M3 NaN (0x7F), so the whole tensor dequantizes to NaN and a trainer's
non-finite guard fires instead of training on silently clipped numbers.

Transformer Engine's two newer options (TE >= 2.16; ``four_over_six``, ``scale_bound``, ``row_scaled``;
golden/te_nvfp4_4over6/), RNE only, never with the RHT:

* ``four_over_six="mae" | "mse"`` ("4over6"): each block is quantized twice, its max mapped to 6 and to 4
  (``base = (amax_b / 6) * s_enc``, S6 = e4m3(min(base, 448)), S4 = e4m3(min(base * 1.5, 448))), and the
  candidate with the smaller error ``sum_i e(((e2m1_i * S) * amax) / (6 B) - x_i)`` (|d| or d*d, summed in
  element order; a 16x16 tile adds its 16 row sums as a tree) is kept; ties keep map-to-6. Nothing but
  the chosen scale byte records the choice.
* ``scale_bound`` B = 448 (standard) or 256 (TE's default under 4over6): s_enc = 6 B / amax. 256 only
  with 4over6 (TE forces 448 otherwise).
* ``row_scaled=True`` (1x16 only): one amax / s_enc / s_dec per row (token), shaped ``[..., 1]``.

With any of them, amax == 0 gives s_enc = FLT_MAX (TE's reference; the standard path keeps 1: codes and
scales are 0 either way) and ``dequantize`` uses TE's dequantize-kernel rounding,
``e2m1 * ((fp32(S) * amax) * fp32(1 / (6 B)))``, which the golden set records.

Implementations (``impl``, see impl.py): "reference" is the PyTorch code below; "triton" the
fused kernel in kernels/ (same bits; one read of x after the amax pass); "auto" (the
default) picks Triton for CUDA tensors.

Two ways in:
* ``quantize`` packs codes (uint8, two per byte) and scales (float8_e4m3fn): storage / exactness.
* ``fake_quantize`` returns ``e2m1 * fp32(scale_b)`` as a dense tensor plus ``s_dec`` — the same
  numbers as ``quantize(...).dequantize(apply_global_scale=False)``, without packing. These
  products have at most 6 significant bits and magnitudes in [2^-10, 2688], so they are exact in
  BF16; an emulated GEMM multiplies the two operands' ``s_dec`` into its FP32 output afterwards,
  like the hardware epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import e2m1, hadamard
from .impl import use_triton
from .rounding import random_bits_like

BLOCK = 16
E4M3_MAX = 448.0
TILES = ((1, 16), (16, 16))
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLT_MAX = torch.finfo(torch.float32).max
FOUR_OVER_SIX_MODES = (None, "mae", "mse")
SCALE_BOUNDS = (448, 256)


@dataclass
class NVFP4Tensor:
    """A packed NVFP4 tensor. ``shape`` is the logical shape ``[..., cols]``."""

    codes: torch.Tensor  # uint8 [..., cols // 2], element 2j in the low nibble
    scales: torch.Tensor  # float8_e4m3fn [..., cols // 16] block decode scales
    amax: torch.Tensor  # float32 0-d, max|x| the global scale came from
    global_decode_scale: torch.Tensor  # float32 0-d, 1 / s_enc
    shape: torch.Size
    tile: tuple[int, int]
    # TE's options (module docstring): amax and global_decode_scale are [..., 1] when row_scaled.
    four_over_six: str | None = None
    scale_bound: int = 448
    row_scaled: bool = False

    @property
    def te_options(self) -> bool:
        """Whether any of TE's newer options is on (they change dequantize's rounding)."""
        return self.four_over_six is not None or self.row_scaled or self.scale_bound != 448

    @property
    def nbytes(self) -> int:
        """Packed storage: codes + block scales + the FP32 amax (one per row when row-scaled)."""
        return self.codes.numel() + self.scales.numel() + 4 * self.amax.numel()

    def unpacked_codes(self) -> torch.Tensor:
        """One 4-bit code per uint8, logical shape."""
        return e2m1.unpack(self.codes)

    def dequantize(
        self, dtype: torch.dtype = torch.float32, apply_global_scale: bool = True, *, impl: str = "auto"
    ) -> torch.Tensor:
        """Decode to ``dtype``. ``apply_global_scale=False`` returns ``e2m1 * fp32(scale_b)``
        only (exact in BF16; apply ``global_decode_scale`` after the matmul). On CUDA one Triton pass
        (the same bits). With TE's options (``te_options``) the global scale is applied with TE's
        dequantize-kernel rounding (module docstring), in PyTorch on any device."""
        if self.te_options and apply_global_scale:
            return dequantize_te(self.codes, self.scales, self.amax, self.scale_bound).reshape(self.shape).to(dtype)
        if use_triton(self.codes, impl, "nvfp4.NVFP4Tensor.dequantize"):
            from . import kernels

            return kernels.dequant.e2m1(
                self.codes,
                self.scales,
                self.global_decode_scale if apply_global_scale else None,
                self.shape,
                BLOCK,
                e8m0=False,
                dtype=dtype,
            )
        # (e2m1 * 2^-14) * (scale_b * 2^14): both factors exact, so the product is e2m1 * scale_b
        # exactly, as decode(codes) * scale_b would give (see e2m1.decode_scaled).
        scaled = e2m1.decode_scaled(self.codes).unflatten(-1, (-1, BLOCK))
        scale = self.scales.to(torch.float32).mul_(1.0 / e2m1.FP16_FROM_E2M1).unsqueeze(-1)
        values = scaled * scale  # FP32
        if apply_global_scale:
            values.mul_(self.global_decode_scale)
        return values.flatten(-2).to(dtype)


def dequantize_te(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int) -> torch.Tensor:
    """FP32 [..., cols] values of packed codes, TE's dequantize kernel: ``e2m1 * fl(fl(fp32(S) * amax) * c)``,
    c = fp32(1 / (6 B)) a rounded constant; amax 0-d, or [..., 1] per row."""
    final = scales.to(torch.float32) * amax.to(torch.float32)  # amax broadcasts: 0-d or [..., 1]
    final = final * torch.reciprocal(torch.full((), 6.0 * scale_bound, dtype=torch.float32, device=codes.device))
    values = e2m1.decode(e2m1.unpack(codes)).unflatten(-1, (-1, BLOCK))
    return (values * final.unsqueeze(-1)).flatten(-2)


def check_te_options(tile, rounding: str, four_over_six, scale_bound, row_scaled, who: str = "nvfp4") -> None:
    """TE's rules for 4over6 / the scale bound / row scaling, each refusal one line (ValueError)."""
    if four_over_six not in FOUR_OVER_SIX_MODES:
        raise ValueError(f"{who}: four_over_six={four_over_six!r} is not supported; allowed: {FOUR_OVER_SIX_MODES}")
    if scale_bound not in SCALE_BOUNDS or isinstance(scale_bound, bool):
        raise ValueError(f"{who}: scale_bound={scale_bound!r} is not supported; allowed: {SCALE_BOUNDS}")
    if scale_bound != 448 and four_over_six is None:
        raise ValueError(
            f"{who}: scale_bound=256 needs four_over_six ('mae' or 'mse'); without 4over6 the bound is 448"
        )
    if not isinstance(row_scaled, bool):
        raise ValueError(f"{who}: row_scaled={row_scaled!r} is not supported; allowed: True, False")
    if row_scaled and tuple(tile) != (1, 16):
        raise ValueError(
            f"{who}: row_scaled=True needs tile (1, 16), got {tuple(tile)} (TE: row-scaled NVFP4 is 1x16 only)"
        )
    if (four_over_six is not None or row_scaled) and rounding != "rne":
        what = "four_over_six" if four_over_six is not None else "row_scaled"
        raise ValueError(
            f"{who}: {what} needs rounding='rne', got {rounding!r} "
            "(TE refuses 4over6 and row scaling with stochastic rounding)"
        )


def _check_input(x: torch.Tensor, tile) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"nvfp4: x must be a torch.Tensor, got {type(x).__name__}")
    if tile not in TILES:
        raise ValueError(f"nvfp4: tile={tile!r} is not supported; allowed: {TILES}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"nvfp4: x.dtype={x.dtype} is not supported; allowed: {INPUT_DTYPES}")
    min_ndim = 2 if tile == (16, 16) else 1
    if x.ndim < min_ndim or x.numel() == 0:
        raise ValueError(
            f"nvfp4: x must be a non-empty tensor with at least {min_ndim} dim(s) for tile {tile}, "
            f"got shape {tuple(x.shape)}"
        )
    cols = x.shape[-1]
    rows = x.numel() // cols
    if cols % BLOCK != 0:
        raise ValueError(
            f"nvfp4: the last dim ({cols}) of shape {tuple(x.shape)} must be a multiple of {BLOCK} (no padding is done)"
        )
    if rows % tile[0] != 0:
        raise ValueError(
            f"nvfp4: tile {tile} needs the row count ({rows}, all dims but the last of {tuple(x.shape)}) "
            f"to be a multiple of {tile[0]}"
        )
    return rows, cols


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """s_enc = 2688 / amax as TE computes it: FP32 division, capped at FLT_MAX, 1 when amax is 0.
    NaN when amax is not finite (see the non-finite policy in the module docstring)."""
    amax = amax.to(torch.float32)
    s_enc = torch.div(torch.full_like(amax, 6.0 * E4M3_MAX), amax)  # a tensor / tensor: one rounding
    s_enc = torch.clamp(s_enc, max=_FLT_MAX)
    s_enc = torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    return torch.where(torch.isfinite(amax), s_enc, torch.full_like(s_enc, float("nan")))


def global_encode_scale_te(amax: torch.Tensor, scale_bound: int) -> torch.Tensor:
    """s_enc = 6 B / amax as TE's reference computes it under its newer options: FP32 division, capped at
    FLT_MAX (so amax == 0 gives FLT_MAX), 1 where it is 0; NaN where amax is not finite (our policy)."""
    amax = amax.to(torch.float32)
    s_enc = torch.div(torch.full_like(amax, 6.0 * scale_bound), amax)
    s_enc = torch.clamp(s_enc, max=_FLT_MAX)
    s_enc = torch.where(s_enc == 0, torch.ones_like(s_enc), s_enc)
    return torch.where(torch.isfinite(amax), s_enc, torch.full_like(s_enc, float("nan")))


def block_amax(a: torch.Tensor, tile, rows: int, cols: int) -> torch.Tensor:
    """FP32 [rows, cols/16] max of ``a`` (= |x|, FP32) per scale block; a 16x16 tile's value is
    repeated on its rows. NaN propagates (max_pool and amax return NaN if any input is NaN)."""
    if tile == (16, 16):
        # Reduce the 16 rows first (an outer dim: vectorized), then the 16 columns.
        a = a.reshape(rows // 16, 16, cols).amax(dim=1)
    # max_pool1d with kernel = stride = 16 is the blocks' max, faster on CPU than amax(dim=-1), whose
    # reduction over a short contiguous dim is not vectorized (docs/results/code-measurements.md).
    amax_b = torch.nn.functional.max_pool1d(a.reshape(-1, 1, cols), BLOCK, BLOCK).view(-1, cols // BLOCK)
    return amax_b.repeat_interleave(16, dim=0) if tile == (16, 16) else amax_b


def _draw_random_bits(x: torch.Tensor, rounding: str, generator) -> torch.Tensor | None:
    """SR's random bits for the reference path; None for RNE."""
    return random_bits_like(x, generator) if rounding == "sr" else None


def _quantize_core(x: torch.Tensor, tile, rounding: str, random_bits):
    """Shared by ``quantize`` and ``fake_quantize`` (arguments already checked): returns
    (values [rows, nb, 16] FP32 signed E2M1 values, scales_e4m3 [rows, nb], amax, s_dec)."""
    cols = x.shape[-1]
    rows = x.numel() // cols
    nb = cols // BLOCK
    # Two FP32 scratch tensors: y (x, scaled and rounded in place) and |x| (then the magnitudes).
    y = x.reshape(rows, cols).to(torch.float32, copy=True)  # exact for bf16/fp16
    magnitude = y.abs()
    amax_b = block_amax(magnitude, tile, rows, cols)  # [rows, nb]
    amax = amax_b.amax()  # == max|x|; NaN propagates

    s_enc = global_encode_scale(amax)
    s_dec = torch.reciprocal(s_enc)
    # TE folds 1/6 into the global multiplier "to ensure exact match" with its kernel.
    # (full_like, not torch.tensor: no host-to-device copy per call.)
    multiplier = s_enc * torch.reciprocal(torch.full_like(s_enc, e2m1.E2M1_MAX))
    # Saturate before the cast: PyTorch's float8 cast is not guaranteed to saturate.
    scales = torch.clamp(amax_b * multiplier, max=E4M3_MAX).to(torch.float8_e4m3fn)
    block_encode = torch.clamp(torch.reciprocal(scales.to(torch.float32) * s_dec), max=_FLT_MAX)

    y = y.view(rows, nb, BLOCK).mul_(block_encode.unsqueeze(-1))
    scratch = magnitude.view(rows, nb, BLOCK)
    values = e2m1.round_signed_(y, rounding, scratch=scratch, random_bits=random_bits)
    return values, scales, amax, s_dec


def _sequential_sum(e: torch.Tensor) -> torch.Tensor:
    """FP32 sum over the last dim in element order (TE's loop), not torch.sum's pairwise order."""
    acc = e[..., 0].clone()
    for i in range(1, e.shape[-1]):
        acc += e[..., i]
    return acc


def _tile_tree_sum(r: torch.Tensor) -> torch.Tensor:
    """[rows, nb] row errors -> the 16x16 tile's sum repeated on its rows: rows i + i+8, then +4, +2, +1
    (TE's warp-shuffle order)."""
    t = r.reshape(-1, 16, r.shape[-1])
    for half in (8, 4, 2, 1):
        t = t[:, :half] + t[:, half:]
    return t.expand(-1, 16, -1).reshape(r.shape)


def _quantize_core_te(x: torch.Tensor, tile, four_over_six, scale_bound: int, row_scaled: bool):
    """``_quantize_core`` under TE's options (RNE): (values [rows, nb, 16], scales_e4m3 [rows, nb], amax, s_dec),
    amax and s_dec 0-d, or [rows, 1] when row-scaled."""
    cols = x.shape[-1]
    rows = x.numel() // cols
    nb = cols // BLOCK
    xf = x.reshape(rows, cols).to(torch.float32, copy=True)
    amax_b = block_amax(xf.abs(), tile, rows, cols)  # [rows, nb]
    amax = amax_b.amax(dim=1, keepdim=True) if row_scaled else amax_b.amax()
    s_enc = global_encode_scale_te(amax, scale_bound)
    s_dec = torch.reciprocal(s_enc)
    x_blocks = xf.view(rows, nb, BLOCK)

    def encode(scales):
        block_encode = torch.clamp(torch.reciprocal(scales.to(torch.float32) * s_dec), max=_FLT_MAX)
        return e2m1.round_signed_(x_blocks * block_encode.unsqueeze(-1), "rne")

    if four_over_six is None:  # row-scaled standard NVFP4: section 2's folded multiplier, per row
        multiplier = s_enc * torch.reciprocal(torch.full_like(s_enc, e2m1.E2M1_MAX))
        scales = torch.clamp(amax_b * multiplier, max=E4M3_MAX).to(torch.float8_e4m3fn)
        return encode(scales), scales, amax, s_dec

    candidates = []
    for values, scales, e in _four_over_six_candidates(
        x_blocks, amax_b, amax, s_enc, encode, four_over_six, scale_bound, row_scaled
    ):
        err = _sequential_sum(e)
        candidates.append((values, scales, _tile_tree_sum(err) if tile == (16, 16) else err))
    (values6, scales6, err6), (values4, scales4, err4) = candidates
    values, scales = _pick(err4 < err6, values6, scales6, values4, scales4)
    return values, scales, amax, s_dec


def _four_over_six_candidates(x_blocks, amax_b, amax, s_enc, encode, four_over_six, scale_bound: int, row_scaled: bool):
    """4over6's map-to-6 and map-to-4 candidates of x_blocks [rows, nb, 16]: [(values [rows, nb, 16], scales
    e4m3 [rows, nb], per-element error [rows, nb, 16])] in that order. ``encode(scales)`` rounds x_blocks
    onto E2M1 under the block scales. The element errors do not depend on the summation order: the
    rowwise and columnwise copies of a 16x16 tile share them (``quantize_tiles_rowcol``)."""
    # divide first, then multiply (not the folded order of the standard path); both candidates clamp at 448.
    base = torch.div(amax_b, e2m1.E2M1_MAX) * s_enc
    out = []
    for scaled in (base, base * 1.5):  # map-to-6, map-to-4
        scales = torch.clamp(scaled, max=E4M3_MAX).to(torch.float8_e4m3fn)
        values = encode(scales)
        # error in the input domain: ((q * S) * amax) / (6 B) - x, a true division by the constant
        recon = values * scales.to(torch.float32).unsqueeze(-1)
        recon = torch.div(recon * (amax.unsqueeze(-1) if row_scaled else amax), 6.0 * scale_bound)
        d = recon - x_blocks
        out.append((values, scales, d.abs() if four_over_six == "mae" else d * d))
    return out


def _pick(pick4, values6, scales6, values4, scales4):
    """(values, scales) of the chosen candidates: map-to-4 where ``pick4`` (err4 < err6, strict: ties and NaN
    keep map-to-6)."""
    values = torch.where(pick4.unsqueeze(-1), values4, values6)
    scales = torch.where(pick4, scales4.view(torch.uint8), scales6.view(torch.uint8)).view(torch.float8_e4m3fn)
    return values, scales


def _core(x, tile, rounding, random_bits, four_over_six, scale_bound, row_scaled):
    if four_over_six is None and not row_scaled:
        return _quantize_core(x, tile, rounding, random_bits)  # scale_bound is 448 here (checked)
    values, scales, amax, s_dec = _quantize_core_te(x, tile, four_over_six, scale_bound, row_scaled)
    if row_scaled:
        lead = x.shape[:-1]
        amax, s_dec = amax.reshape(*lead, 1), s_dec.reshape(*lead, 1)
    return values, scales, amax, s_dec


def _quantize_impl(
    x: torch.Tensor, tile, rounding: str, random_bits, four_over_six=None, scale_bound=448, row_scaled=False
):
    """Packed codes [..., cols/2], scales [..., cols/16], amax, s_dec."""
    values, scales, amax, s_dec = _core(x, tile, rounding, random_bits, four_over_six, scale_bound, row_scaled)
    lead = x.shape[:-1]
    codes = e2m1.pack(e2m1.encode_values(values).flatten(-2))
    return codes.reshape(*lead, -1), scales.reshape(*lead, -1), amax, s_dec


def _fake_quantize_impl(
    x: torch.Tensor,
    tile,
    rounding: str,
    random_bits,
    out_dtype: torch.dtype,
    four_over_six=None,
    scale_bound=448,
    row_scaled=False,
):
    """(e2m1 * scale_b in out_dtype, s_dec)."""
    values, scales, _, s_dec = _core(x, tile, rounding, random_bits, four_over_six, scale_bound, row_scaled)
    values.mul_(scales.to(torch.float32).unsqueeze(-1))  # e2m1 * scale_b: exact (FP32 and bf16)
    return values.view(x.shape).to(out_dtype), s_dec


def quantize(
    x: torch.Tensor,
    tile=(1, 16),
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    *,
    impl: str = "auto",
    four_over_six: str | None = None,
    scale_bound: int = 448,
    row_scaled: bool = False,
) -> NVFP4Tensor:
    """Quantize ``x`` (float32/bfloat16/float16, blocks along dim -1) to packed NVFP4.

    rounding: "rne" (weights, activations) or "sr" (gradients; draws from ``generator``, a
    ``torch.Generator`` on x's device, or torch's default generator when None).
    four_over_six / scale_bound / row_scaled: TE's options (module docstring; RNE only).
    impl: "auto" | "reference" | "triton" (see the module docstring)."""
    tile = tuple(tile)
    _check_input(x, tile)
    e2m1.check_rounding(rounding)
    check_te_options(tile, rounding, four_over_six, scale_bound, row_scaled, "nvfp4.quantize")
    options: dict[str, Any] = {"four_over_six": four_over_six, "scale_bound": scale_bound, "row_scaled": row_scaled}
    if use_triton(x, impl, "nvfp4.quantize"):
        from . import kernels

        codes, scales, amax, s_dec = kernels.nvfp4.quantize(
            x, tile[0], rounding, dense=False, generator=generator, **options
        )
        scales = scales.view(torch.float8_e4m3fn)
    else:
        random_bits = _draw_random_bits(x, rounding, generator)
        codes, scales, amax, s_dec = _quantize_impl(x, tile, rounding, random_bits, **options)
    return NVFP4Tensor(
        codes=codes,
        scales=scales,
        amax=amax,
        global_decode_scale=s_dec,
        shape=x.shape,
        tile=tuple(tile),
        **options,
    )


def fake_quantize(
    x: torch.Tensor,
    tile=(1, 16),
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    impl: str = "auto",
    four_over_six: str | None = None,
    scale_bound: int = 448,
    row_scaled: bool = False,
):
    """``(values, global_decode_scale)`` with ``values = e2m1 * fp32(scale_b)`` in ``out_dtype``
    (default: x.dtype; exact in bf16/fp32), equal bit for bit to
    ``quantize(...).dequantize(out_dtype, apply_global_scale=False)`` (the same ``impl`` and
    generator state). No packing, no Python loops. Row-scaled: ``global_decode_scale`` is [..., 1],
    one per row (it broadcasts against ``values`` and a GEMM's output rows)."""
    tile = tuple(tile)
    _check_input(x, tile)
    e2m1.check_rounding(rounding)
    check_te_options(tile, rounding, four_over_six, scale_bound, row_scaled, "nvfp4.fake_quantize")
    options: dict[str, Any] = {"four_over_six": four_over_six, "scale_bound": scale_bound, "row_scaled": row_scaled}
    if use_triton(x, impl, "nvfp4.fake_quantize"):
        from . import kernels

        values, _, s_dec = kernels.nvfp4.quantize(
            x, tile[0], rounding, dense=True, generator=generator, out_dtype=out_dtype or x.dtype, **options
        )
        return values, s_dec
    random_bits = _draw_random_bits(x, rounding, generator)
    return _fake_quantize_impl(x, tile, rounding, random_bits, out_dtype or x.dtype, **options)


# ------------------------------------------------------------------------------ a weight and its transpose
def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _tiles_rowcol_core(x: torch.Tensor, four_over_six: str, scale_bound: int):
    """``_quantize_core_te`` of x [rows, cols] (both multiples of 16) and of x.T, 16x16 tiles under 4over6, from
    one pass: ((values [rows, nb, 16], scales [rows, nb]), (values [cols, rows/16, 16], scales [cols, rows/16]),
    amax, s_dec). A tile's maximum, candidates, codes and element errors are the same in both orientations; only
    the order the errors are summed in differs (x's rows then a tree over rows; x.T's rows, i.e. x's columns,
    then a tree over columns), so each copy makes its own choice."""
    rows, cols = x.shape
    nb = cols // BLOCK
    xf = x.to(torch.float32, copy=True)
    amax_b = block_amax(xf.abs(), (16, 16), rows, cols)  # [rows, nb]; the same maxima as x.T's tiles
    amax = amax_b.amax()
    s_enc = global_encode_scale_te(amax, scale_bound)
    s_dec = torch.reciprocal(s_enc)
    x_blocks = xf.view(rows, nb, BLOCK)

    def encode(scales):  # as in _quantize_core_te
        block_encode = torch.clamp(torch.reciprocal(scales.to(torch.float32) * s_dec), max=_FLT_MAX)
        return e2m1.round_signed_(x_blocks * block_encode.unsqueeze(-1), "rne")

    (values6, scales6, e6), (values4, scales4, e4) = _four_over_six_candidates(
        x_blocks, amax_b, amax, s_enc, encode, four_over_six, scale_bound, False
    )

    def transposed(t):  # [rows, nb, 16] elements -> x.T's [cols, rows / 16, 16]
        return t.reshape(rows, cols).t().reshape(cols, rows // BLOCK, BLOCK)

    def transposed_scales(scales):  # a tile's scale, repeated on x.T's 16 rows of it
        return scales.view(torch.uint8)[::16].t().repeat_interleave(16, dim=0).view(torch.float8_e4m3fn)

    def row_err(e):
        return _tile_tree_sum(_sequential_sum(e))

    row = _pick(row_err(e4) < row_err(e6), values6, scales6, values4, scales4)
    col_pick = row_err(transposed(e4)) < row_err(transposed(e6))
    col = _pick(
        col_pick, transposed(values6), transposed_scales(scales6), transposed(values4), transposed_scales(scales4)
    )
    return row, col, amax, s_dec


def _tiles_rowcol_outputs(values, scales, shape, width: int, dense: bool, out_dtype):
    """Packed (codes, scales) or dense (values,) of one copy [rows, cols] (values [rows, nb, 16]), K zero-padded to
    ``width``: a padded all-zero tile has code 0, scale 0 and value 0, as quantizing the zeros gives."""
    rows, cols = shape
    pad = width - cols
    if dense:
        values = values.mul(scales.to(torch.float32).unsqueeze(-1)).view(rows, cols).to(out_dtype)
        return (torch.nn.functional.pad(values, (0, pad)) if pad else values,)
    codes = e2m1.pack(e2m1.encode_values(values).flatten(-2))
    scales = scales.view(torch.uint8)
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad // 2))
        scales = torch.nn.functional.pad(scales, (0, pad // BLOCK))
    return codes, scales


def quantize_tiles_rowcol(
    x: torch.Tensor,
    four_over_six: str = "mae",
    scale_bound: int = 256,
    *,
    dense: bool = False,
    out_dtype: torch.dtype | None = None,
    row_width: int | None = None,
    col_width: int | None = None,
    impl: str = "auto",
):
    """Both copies of a 4over6 weight with 16x16 tiles from one read of x [rows, cols] (Fprop's W and Dgrad's
    Wᵀ): ``(rowwise, columnwise)`` with, for xp = x zero-padded to [rows rounded up to 16, row_width],

    * rowwise = ``quantize(xp, (16, 16), four_over_six=..., scale_bound=...)``,
    * columnwise = the same of xp.T zero-padded to [row_width, col_width],

    bit for bit (each an ``NVFP4Tensor``, or with ``dense`` the ``fake_quantize`` pair ``(values,
    global_decode_scale)`` in ``out_dtype``, default x.dtype). Under 4over6 the two are not transposes of each
    other: a tile's error is summed along its rows for one and along its columns for the other, which can pick
    a different candidate (TE quantizes the columnwise copy so). The tile's maximum, candidates, codes and
    element errors are shared, so one pass serves both: on CUDA one Triton kernel reads x once and writes both
    copies. ``row_width`` / ``col_width``: multiples of 16, at least cols / rows (default: rounded up to 16)."""
    who = "nvfp4.quantize_tiles_rowcol"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{who}: x.dtype={x.dtype} is not supported; allowed: {INPUT_DTYPES}")
    if x.ndim != 2 or x.numel() == 0:
        raise ValueError(f"{who}: x must be a non-empty 2-D tensor, got shape {tuple(x.shape)}")
    if four_over_six not in ("mae", "mse"):
        raise ValueError(f"{who}: four_over_six={four_over_six!r} is not supported; allowed: 'mae', 'mse'")
    check_te_options((16, 16), "rne", four_over_six, scale_bound, False, who)
    rows, cols = x.shape
    padded_rows = _round_up(rows, 16)
    row_width = _round_up(cols, 16) if row_width is None else row_width
    col_width = padded_rows if col_width is None else col_width
    for name, width, least in (("row_width", row_width, cols), ("col_width", col_width, rows)):
        if isinstance(width, bool) or not isinstance(width, int) or width % 16 or width < least:
            raise ValueError(
                f"{who}: {name}={width!r} must be a multiple of 16 and at least {least} (x has shape {tuple(x.shape)})"
            )
    out_dtype = out_dtype or x.dtype
    if padded_rows != rows or row_width != cols:
        x = torch.nn.functional.pad(x, (0, row_width - cols, 0, padded_rows - rows))
    if use_triton(x, impl, who):
        from . import kernels

        row, col = kernels.nvfp4.quantize_tiles_rowcol(
            x, four_over_six, scale_bound, dense=dense, out_dtype=out_dtype, col_width=col_width
        )
    else:
        (values, scales), (values_t, scales_t), amax, s_dec = _tiles_rowcol_core(x, four_over_six, scale_bound)
        row = _tiles_rowcol_outputs(values, scales, (padded_rows, row_width), row_width, dense, out_dtype)
        row += (amax, s_dec)
        col = _tiles_rowcol_outputs(values_t, scales_t, (row_width, padded_rows), col_width, dense, out_dtype)
        col += (amax.clone(), s_dec.clone())  # tensors of their own, as two separate calls give
    options: dict[str, Any] = {"four_over_six": four_over_six, "scale_bound": scale_bound}
    out: list[Any] = []
    for parts, shape in ((row, (padded_rows, row_width)), (col, (row_width, col_width))):
        if dense:
            out.append((parts[0], parts[2]))
        else:
            codes, scales, amax, s_dec = parts
            out.append(
                NVFP4Tensor(
                    codes, scales.view(torch.float8_e4m3fn), amax, s_dec, torch.Size(shape), (16, 16), **options
                )
            )
    return tuple(out)


# ------------------------------------------------------------------------------ Wgrad operand
def rht_quantize_t(
    x: torch.Tensor,
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    signs=None,
    *,
    impl: str = "auto",
    blocks: tuple[int, ...] | None = None,
) -> NVFP4Tensor:
    """The Wgrad operand of ``x`` [tokens, features]: NVFP4 (1x16) of ``hadamard.rht(x.T, 16,
    signs)``, shape [features, tokens], its global scale from the transformed tensor's amax.

    Same bits as ``quantize(hadamard.rht(x.t(), 16, signs), (1, 16), rounding, generator)``
    (which is what impl="reference" runs); the Triton kernel reads x row-major and never
    materializes the transpose or the transform. SR bits follow the [features, tokens] layout.
    ``blocks``: the Triton kernels' (groups of 16 tokens, features[, warps]) per program
    (kernels.rht.program_blocks; a speed knob, the bits do not depend on it)."""
    signs = e2m1.check_wgrad_args(x, BLOCK, rounding, signs, "nvfp4.rht_quantize_t")
    if not use_triton(x, impl, "nvfp4.rht_quantize_t"):
        return quantize(
            hadamard.rht(x.t(), BLOCK, signs, "reference"), (1, BLOCK), rounding, generator, impl="reference"
        )
    from . import kernels

    codes, scales, amax, s_dec = kernels.rht.nvfp4_t(
        x, signs, rounding, dense=False, generator=generator, blocks=blocks
    )
    return NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), amax, s_dec, torch.Size(x.shape[::-1]), (1, BLOCK))


def rht_fake_quantize_t(
    x: torch.Tensor,
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    signs=None,
    out_dtype: torch.dtype | None = None,
    *,
    impl: str = "auto",
    blocks: tuple[int, ...] | None = None,
):
    """``(values [features, tokens], global_decode_scale)``: ``fake_quantize`` of
    ``hadamard.rht(x.T, 16, signs)`` (see ``rht_quantize_t``)."""
    signs = e2m1.check_wgrad_args(x, BLOCK, rounding, signs, "nvfp4.rht_fake_quantize_t")
    if not use_triton(x, impl, "nvfp4.rht_fake_quantize_t"):
        return fake_quantize(
            hadamard.rht(x.t(), BLOCK, signs, "reference"), (1, BLOCK), rounding, generator, out_dtype, impl="reference"
        )
    from . import kernels

    values, _, s_dec = kernels.rht.nvfp4_t(
        x, signs, rounding, dense=True, generator=generator, out_dtype=out_dtype or x.dtype, blocks=blocks
    )
    return values, s_dec


def quantize_rowwise_and_rht_t(
    x: torch.Tensor,
    rounding: str = "rne",
    generator: torch.Generator | None = None,
    signs=None,
    *,
    rowwise_dense: bool = False,
    columnwise_dense: bool = False,
    out_dtype: torch.dtype | None = None,
    impl: str = "auto",
    blocks: tuple[int, ...] | None = None,
    columnwise_generator: torch.Generator | None = None,
):
    """Both NVFP4 copies the recipe takes of an activation or gradient x [tokens, features], from
    one read of x on CUDA: ``(rowwise, columnwise)`` with

    * rowwise = ``quantize(x, (1, 16), rounding)`` (Fprop / Dgrad operand), or with
      ``rowwise_dense`` the ``fake_quantize`` pair ``(values, global_decode_scale)``;
    * columnwise = ``rht_quantize_t(x, rounding, signs=signs)`` (Wgrad operand), or with
      ``columnwise_dense`` the ``rht_fake_quantize_t`` pair.

    Each copy has its own global scale, as if quantized separately (RNE: the same bits as the two
    separate calls). SR: the reference path draws the rowwise bits first, then the columnwise ones;
    the Triton path draws one Philox seed for each, the columnwise one first. ``columnwise_generator``:
    the columnwise copy's draws come from it (default ``generator``), as when the two operands belong to
    roles with their own SR streams."""
    signs = e2m1.check_wgrad_args(x, BLOCK, rounding, signs, "nvfp4.quantize_rowwise_and_rht_t")
    out_dtype = out_dtype or x.dtype
    if not use_triton(x, impl, "nvfp4.quantize_rowwise_and_rht_t"):
        if rowwise_dense:
            rowwise = fake_quantize(x, (1, BLOCK), rounding, generator, out_dtype, impl="reference")
        else:
            rowwise = quantize(x, (1, BLOCK), rounding, generator, impl="reference")
        col_generator = generator if columnwise_generator is None else columnwise_generator
        if columnwise_dense:
            return rowwise, rht_fake_quantize_t(x, rounding, col_generator, signs, out_dtype, impl="reference")
        return rowwise, rht_quantize_t(x, rounding, col_generator, signs, impl="reference")
    from . import kernels

    seeds = None
    if rounding == "sr" and columnwise_generator is not None:  # [columnwise, rowwise], the kernel's order
        seeds = torch.cat(
            [kernels.rounding.philox_seed(x, columnwise_generator), kernels.rounding.philox_seed(x, generator)]
        )
    row, col = kernels.rht.nvfp4_t(
        x,
        signs,
        rounding,
        dense=columnwise_dense,
        generator=generator,
        out_dtype=out_dtype,
        rowwise=True,
        rowwise_dense=rowwise_dense,
        blocks=blocks,
        seeds=seeds,
    )
    if rowwise_dense:
        rowwise = (row[0], row[2])
    else:
        codes, scales, amax, s_dec = row
        rowwise = NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), amax, s_dec, x.shape, (1, BLOCK))
    if columnwise_dense:
        return rowwise, (col[0], col[2])
    codes, scales, amax, s_dec = col
    return rowwise, NVFP4Tensor(
        codes, scales.view(torch.float8_e4m3fn), amax, s_dec, torch.Size(x.shape[::-1]), (1, BLOCK)
    )
