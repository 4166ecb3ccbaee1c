"""FP8 (E4M3 / E5M2) with current scaling: per tensor, or DeepSeek-style blockwise.

Per tensor (TE ``Float8CurrentScaling``):
    encode = fp8_max / max|x|  (FP32 division; 1 if amax is 0; capped at FLT_MAX)
    data   = sat_cast(x * encode),   decode_scale = 1 / encode
Blockwise (TE ``Float8BlockScaling`` / DeepSeek-V3, the paper's FP8 baseline): the same per block
of (1, 128) (activations, gradients; one scale per row-chunk) or (128, 128) (weights). Decode
scales are FP32, shaped ``[rows, cols/128]`` for (1, 128) and ``[rows/128, cols/128]`` for
(128, 128) (one per tile, not repeated — the layout ``torch._scaled_mm`` takes for blockwise
scaling on Hopper). ``pow2_scales=True`` rounds the encode scale down to a power of two (TE's
default for this recipe), which makes dequantized values exact in BF16. One difference from per
tensor, as in TE: where fp8_max / amax overflows FP32 (a block amax below ~1.3e-36), the encode
scale is the *input* dtype's max (bf16: 3.39e38, fp16: 65504), not FLT_MAX.

``sat_cast`` clamps to ±fp8_max before the cast: PyTorch's float8 casts are not specified to
saturate (older versions turn large E4M3 inputs into NaN; E5M2 overflows to Inf).

Non-finite input: if a tensor (per tensor) or block (blockwise) holds NaN/±Inf, its decode scale
is NaN, so everything it scales dequantizes to NaN (never silently clipped to fp8_max).

``fake_quantize_*`` return ``(values, global_decode_scale)`` like nvfp4/mxfp4: per tensor, the FP8
values themselves (exact in BF16) and the tensor's decode scale, to be applied after the matmul;
blockwise, the dequantized values (``out_dtype``, default float32; exact in bf16 only with
``pow2_scales``) and 1.0.

The quantizers take ``impl="auto" | "reference" | "triton"`` (impl.py): on CUDA Triton kernels with
the same bits (blockwise: one fused kernel; tensorwise: an amax pass, then one cast pass), the PyTorch
code here elsewhere.
"""

from __future__ import annotations

import torch

from . import activation
from .impl import use_triton

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
BLOCKS = ((1, 128), (128, 128))
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLT_MAX = torch.finfo(torch.float32).max


def fp8_max(dtype: torch.dtype) -> float:
    _check_fp8_dtype(dtype)
    return float(torch.finfo(dtype).max)  # 448 for E4M3, 57344 for E5M2


def _check_fp8_dtype(dtype) -> None:
    if dtype not in FP8_DTYPES:
        raise ValueError(f"fp8: dtype={dtype} is not supported; allowed: {FP8_DTYPES}")


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fp8: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"fp8: x.dtype={x.dtype} is not supported; allowed: {INPUT_DTYPES}")
    if x.numel() == 0:
        raise ValueError(f"fp8: x must be non-empty, got shape {tuple(x.shape)}")


def saturating_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Clamp to ±fp8_max, then cast with RNE (NaN stays NaN)."""
    limit = fp8_max(dtype)
    return torch.clamp(x, -limit, limit).to(dtype)


def encode_scale_from_amax(
    amax: torch.Tensor, dtype: torch.dtype, pow2_scales: bool = False, scale_for_inf: float = _FLT_MAX
) -> torch.Tensor:
    """FP32 encode scale fp8_max / amax: 1 where amax is 0, NaN where amax is not finite, and
    ``scale_for_inf`` where the division overflows (amax < fp8_max / FLT_MAX, about 1.3e-36 for
    E4M3); with ``pow2_scales`` rounded down to a power of two (so decoding never clips)."""
    amax = amax.to(torch.float32)
    scale = torch.div(torch.full_like(amax, fp8_max(dtype)), amax)
    scale = torch.where(scale == float("inf"), torch.full_like(scale, scale_for_inf), scale)
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    if pow2_scales:
        mantissa, exponent = torch.frexp(scale)  # scale = m * 2^e, m in [0.5, 1)
        scale = torch.ldexp(torch.full_like(scale, 0.5), exponent)  # 2^floor(log2 scale)
    return torch.where(torch.isfinite(amax), scale, torch.full_like(scale, float("nan")))


def quantize_tensorwise(
    x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn, pow2_scales: bool = False, impl: str = "auto"
):
    """``(data_fp8, decode_scale)``: per-tensor current scaling; decode_scale is FP32 0-d."""
    _check_input(x)
    _check_fp8_dtype(dtype)
    if use_triton(x, impl, "fp8.quantize_tensorwise"):
        from . import kernels

        return kernels.fp8.tensorwise(x, dtype, pow2_scales)
    xf = x.to(torch.float32, copy=True)  # scratch: scaled and clamped in place below
    encode = encode_scale_from_amax(xf.abs().amax(), dtype, pow2_scales)
    limit = fp8_max(dtype)
    return xf.mul_(encode).clamp_(-limit, limit).to(dtype), torch.reciprocal(encode)


def quantize_tensorwise_rowcol(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
    *,
    prologue: str | None = None,
    act_input: torch.Tensor | None = None,
    impl: str = "auto",
):
    """``((data, decode_scale), (data_t, decode_scale))``: ``quantize_tensorwise(x)`` and, for the GEMM
    that needs x transposed (Wgrad's K = tokens), ``data_t`` [cols, rows] contiguous, the bits
    ``quantize_tensorwise(x.t())`` gives: a per-tensor scale commutes with the transpose (the amax of
    x.T is the amax of x), so those are x's codes transposed. On CUDA one amax pass and one cast pass
    write both (no transposing copy of the codes afterwards). x is 2-D; the one decode scale is
    returned for both. ``prologue``: quantize ``activation.apply(prologue, x, act_input)`` instead of x; the
    kernels apply it as they read x (bf16), without writing it."""
    _check_input(x)
    _check_fp8_dtype(dtype)
    if x.ndim != 2:
        raise ValueError(f"fp8.quantize_tensorwise_rowcol: x must be 2-D, got shape {tuple(x.shape)}")
    if prologue is not None:
        activation.check(prologue, x, act_input)
    if use_triton(x, impl, "fp8.quantize_tensorwise_rowcol"):
        from . import kernels

        if prologue is not None and x.dtype != torch.bfloat16:
            x, prologue, act_input = activation.apply(prologue, x, act_input), None, None
        data, data_t, decode = kernels.fp8.tensorwise_rowcol(x, dtype, pow2_scales, prologue, act_input)
        return (data.view(dtype), decode), (data_t.view(dtype), decode)
    x = activation.apply(prologue, x, act_input)
    data, decode = quantize_tensorwise(x, dtype, pow2_scales, impl="reference")
    return (data, decode), (data.view(torch.uint8).t().contiguous().view(dtype), decode)


def fake_quantize_tensorwise(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
    out_dtype: torch.dtype | None = None,
    impl: str = "auto",
):
    """``(fp8 values in out_dtype (default x.dtype), decode_scale)``; apply the scale after the matmul."""
    data, decode = quantize_tensorwise(x, dtype, pow2_scales, impl=impl)
    return data.to(out_dtype or x.dtype), decode


def _check_block(x: torch.Tensor, block) -> None:
    block = tuple(block)
    if block not in BLOCKS:
        raise ValueError(f"fp8: block={block!r} is not supported; allowed: {BLOCKS}")
    if x.ndim < 2:
        raise ValueError(f"fp8: blockwise scaling needs a tensor with >= 2 dims, got shape {tuple(x.shape)}")
    cols = x.shape[-1]
    rows = x.numel() // cols
    br, bc = block
    if cols % bc or rows % br:
        raise ValueError(
            f"fp8: block {block} must divide (rows={rows}, cols={cols}) of shape {tuple(x.shape)} (no padding is done)"
        )


def _block_view(x: torch.Tensor, block) -> tuple[torch.Tensor, tuple[int, int]]:
    """x as a fresh FP32 [rows/br, br, cols/bc, bc] (callers may modify it) plus the scale grid."""
    _check_block(x, block)
    cols = x.shape[-1]
    rows = x.numel() // cols
    br, bc = tuple(block)
    return x.reshape(rows // br, br, cols // bc, bc).to(torch.float32, copy=True), (rows // br, cols // bc)


def quantize_blockwise(
    x: torch.Tensor,
    block=(1, 128),
    dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
    *,
    impl: str = "auto",
):
    """``(data_fp8 [x.shape], decode_scales FP32)``; scales are [rows, cols/128] for (1, 128) and
    [rows/128, cols/128] for (128, 128) (leading dims of x flattened into rows)."""
    _check_input(x)
    _check_fp8_dtype(dtype)
    _check_block(x, block)
    if use_triton(x, impl, "fp8.quantize_blockwise"):
        from . import kernels

        data, scales = kernels.fp8.blockwise(x, tuple(block), dtype, pow2_scales, dense=False)
        return data.view(dtype), scales
    xb, grid = _block_view(x, block)
    # amax over the block's rows first (an outer dim: vectorized), then its columns.
    block_abs = xb.abs()
    rows_max = block_abs.amax(dim=1) if xb.shape[1] > 1 else block_abs.squeeze(1)
    # TE's blockwise kernels replace an overflowing scale by the input dtype's max (TE
    # compute_scale_from_types: value_for_inf = max of the input type), not FLT_MAX as per tensor.
    scale_for_inf = float(torch.finfo(x.dtype).max)
    encode = encode_scale_from_amax(rows_max.amax(dim=-1), dtype, pow2_scales, scale_for_inf)  # [grid]
    limit = fp8_max(dtype)
    data = xb.mul_(encode[:, None, :, None]).clamp_(-limit, limit).to(dtype)
    return data.reshape(x.shape), torch.reciprocal(encode)


def _check_tokens_input(x: torch.Tensor, dtype: torch.dtype, who: str) -> None:
    """The input of a quantizer with blocks along tokens (``who``): x [tokens, features], tokens a multiple of
    128, and an FP8 dtype; one-line errors otherwise."""
    _check_input(x)
    _check_fp8_dtype(dtype)
    if x.ndim != 2 or x.shape[0] % 128:
        raise ValueError(
            f"{who}: x must be 2-D [tokens, features] with tokens a multiple of 128, got shape {tuple(x.shape)}"
        )


def quantize_blockwise_t(
    x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn, pow2_scales: bool = False, *, impl: str = "auto"
):
    """``quantize_blockwise(x.t(), (1, 128), dtype, pow2_scales)`` of x [tokens, features] (tokens a
    multiple of 128): the Wgrad operands Xᵀ and dYᵀ, blocks of 128 tokens per feature. The Triton kernel
    reads x row-major and writes the transposed codes, without the transposed copy of x the reference
    (impl="reference") makes first. Same bits."""
    _check_tokens_input(x, dtype, "fp8.quantize_blockwise_t")
    if use_triton(x, impl, "fp8.quantize_blockwise_t"):
        from . import kernels

        data, scales = kernels.fp8.blockwise_t(x, dtype, pow2_scales)
        return data.view(dtype), scales
    return quantize_blockwise(x.t().contiguous(), (1, 128), dtype, pow2_scales, impl="reference")


def quantize_blockwise_rowcol(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
    *,
    row_width: int | None = None,
    prologue: str | None = None,
    act_input: torch.Tensor | None = None,
    impl: str = "auto",
):
    """``(quantize_blockwise(x zero-padded to [tokens, row_width], (1, 128)), quantize_blockwise_t(x))`` of x
    [tokens, features], tokens a multiple of 128: the two copies the FP8 blockwise recipe takes of an
    activation or a gradient (blocks along features for Fprop / Dgrad, along tokens for Wgrad), from one
    read of x on CUDA. ``row_width`` (a multiple of 128, at least features; default: features rounded up to
    128) is the row copy's K, padded for its GEMM; the Wgrad copy keeps the features as they are. Same bits.
    ``prologue``: quantize ``activation.apply(prologue, x, act_input)`` instead of x; the kernel applies it as it
    reads x (bf16), without writing it."""
    _check_tokens_input(x, dtype, "fp8.quantize_blockwise_rowcol")
    if prologue is not None:
        activation.check(prologue, x, act_input)
    n_features = x.shape[1]
    row_width = -(-n_features // 128) * 128 if row_width is None else row_width
    if row_width % 128 or row_width < n_features:
        raise ValueError(
            f"fp8.quantize_blockwise_rowcol: row_width={row_width} must be a multiple of 128 and at "
            f"least the {n_features} features"
        )
    if use_triton(x, impl, "fp8.quantize_blockwise_rowcol"):
        from . import kernels

        if prologue is not None and x.dtype != torch.bfloat16:
            x, prologue, act_input = activation.apply(prologue, x, act_input), None, None
        (rd, rs), (cd, cs) = kernels.fp8.blockwise_rowcol(x, dtype, pow2_scales, row_width, prologue, act_input)
        return (rd.view(dtype), rs), (cd.view(dtype), cs)
    x = activation.apply(prologue, x, act_input)
    padded = torch.nn.functional.pad(x, (0, row_width - n_features))
    return (
        quantize_blockwise(padded, (1, 128), dtype, pow2_scales, impl="reference"),
        quantize_blockwise_t(x, dtype, pow2_scales, impl="reference"),
    )


def quantize_tiles_rowcol(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
    *,
    row_width: int | None = None,
    col_width: int | None = None,
    impl: str = "auto",
):
    """``((data, scales), (data_t, scales_t))``: ``quantize_blockwise(x zero-padded to [rows rounded up to 128,
    row_width], (128, 128))`` of a 2-D x [rows, cols], and the same codes and scales transposed, the K of the
    transpose zero-padded to ``col_width``: data_t [row_width, col_width] (padding bytes 0), scales_t
    [row_width / 128, col_width / 128] (padding scales 1). A 128x128 tile's scale covers the same elements in
    either orientation, so those are also the bits of quantizing xᵀ zero-padded to [row_width, col_width].
    Blockwise FP8's weight: Fprop reads W, Dgrad Wᵀ. On CUDA one pass reads x once and writes both (no padded
    copy of x, no transposed copy of the codes). ``row_width`` / ``col_width``: multiples of 128, at least cols
    / rows (default: rounded up to 128)."""
    _check_input(x)
    _check_fp8_dtype(dtype)
    if x.ndim != 2:
        raise ValueError(f"fp8.quantize_tiles_rowcol: x must be 2-D, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-cols // 128) * 128
    row_width = padded_cols if row_width is None else row_width
    col_width = padded_rows if col_width is None else col_width
    for name, width, least in (("row_width", row_width, cols), ("col_width", col_width, rows)):
        if width % 128 or width < least:
            raise ValueError(
                f"fp8.quantize_tiles_rowcol: {name}={width} must be a multiple of 128 and at least {least} "
                f"(x has shape {tuple(x.shape)})"
            )
    if use_triton(x, impl, "fp8.quantize_tiles_rowcol"):
        from . import kernels

        (data, scales), (data_t, scales_t) = kernels.fp8.tiles_rowcol(x, dtype, pow2_scales, row_width, col_width)
        return (data.view(dtype), scales), (data_t.view(dtype), scales_t)
    padded = torch.nn.functional.pad(x, (0, row_width - cols, 0, padded_rows - rows))
    data, scales = quantize_blockwise(padded, (128, 128), dtype, pow2_scales, impl="reference")
    data_t = torch.nn.functional.pad(data.view(torch.uint8).t(), (0, col_width - padded_rows)).view(dtype)
    scales_t = torch.nn.functional.pad(scales.t(), (0, (col_width - padded_rows) // 128), value=1.0)
    return (data, scales), (data_t.contiguous(), scales_t.contiguous())


def dequantize_blockwise(
    data: torch.Tensor, scales: torch.Tensor, block=(1, 128), dtype: torch.dtype = torch.float32, impl: str = "auto"
) -> torch.Tensor:
    """Inverse of ``quantize_blockwise`` (FP32 math, then cast to ``dtype``)."""
    block = tuple(block)
    if use_triton(data, impl, "fp8.dequantize_blockwise"):
        from . import kernels

        _check_block(data, block)
        return kernels.dequant.fp8_blockwise(data, scales, block, dtype)
    values, _ = _block_view(data, block)
    return values.mul_(scales[:, None, :, None]).reshape(data.shape).to(dtype)


def fake_quantize_blockwise(
    x: torch.Tensor,
    block=(1, 128),
    dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
    out_dtype: torch.dtype = torch.float32,
    *,
    impl: str = "auto",
):
    """``(dequantized values in out_dtype, 1.0)``; equal to dequantize_blockwise(quantize_blockwise(.))."""
    ones = torch.ones((), dtype=torch.float32, device=x.device)
    if use_triton(x, impl, "fp8.fake_quantize_blockwise"):
        _check_input(x)
        _check_fp8_dtype(dtype)
        _check_block(x, block)
        from . import kernels

        return kernels.fp8.blockwise(x, tuple(block), dtype, pow2_scales, dense=True, out_dtype=out_dtype), ones
    data, scales = quantize_blockwise(x, block, dtype, pow2_scales, impl="reference")
    return dequantize_blockwise(data, scales, block, out_dtype), ones
