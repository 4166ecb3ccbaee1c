"""Pairs of GEMM operands quantized from one read of a tensor: Fprop's X and Wgrad's Xᵀ, Dgrad's dY and
Wgrad's dYᵀ, Fprop's W and Dgrad's Wᵀ. Each pair gives the bits of its two separate quantizations
(`operands.fake_quantize` / `operands.pack`) through one call into the formats' dispatch
(`nvfp4.quantize_rowwise_and_rht_t`, `nvfp4.quantize_tiles_rowcol`, `fp8.quantize_blockwise_rowcol`,
`fp8.quantize_tensorwise_rowcol`, `fp8.quantize_tiles_rowcol`), which picks the fused Triton kernel on CUDA and
the PyTorch reference elsewhere; a pair these do not cover returns None, and the caller quantizes the two operands
separately.
"""

from __future__ import annotations

import torch

from nvfp4train.formats import fp8, nvfp4

from . import operands
from .recipe import OperandSpec


def fprop_and_wgrad_x(
    x2d: torch.Tensor,
    fprop_spec: OperandSpec,
    wgrad_spec: OperandSpec,
    k_f: int,
    k_w: int,
    rht_signs=None,
    prologue: str | None = None,
) -> tuple[operands.Quantized, operands.Packed] | None:
    """Fprop's X operand and Wgrad's packed Xᵀ from one read of X, for the paper's pairs with nothing to
    pad: NVFP4 1x16 RNE and NVFP4 1x16 RNE after the 16-point RHT along tokens
    (nvfp4.quantize_rowwise_and_rht_t), or FP8 1x128 blocks along features and along tokens
    (fp8.quantize_blockwise_rowcol): the bits of the two separate quantizations (`fake_quantize` and
    `pack`), or per-tensor FP8 of X and of Xᵀ with one spec (fp8.quantize_tensorwise_rowcol: the
    codes and their transpose from one cast). None for any other pair (or padding): quantize them
    separately. `prologue` (formats.activation; the FP8 pairs only, None for the others): both operands are of
    activation.apply(prologue, X), applied by the quantizers as they read X."""
    if tensorwise_pair(fprop_spec, wgrad_spec):
        return tensorwise_rowcol(x2d, fprop_spec, k_f, k_w, prologue)
    if _fp8_pair(fprop_spec, wgrad_spec) and _fp8_rowcol_fits(x2d, k_f, k_w):
        (row_data, row_scales), (col_data, col_scales) = _fp8_rowcol(x2d, fprop_spec, k_f, prologue)
        return (
            operands.Quantized(None, None, row_data, row_scales, fprop_spec),
            operands.Packed(
                operands.PackedLayout(wgrad_spec, tuple(x2d.t().shape)),
                (col_data, operands.stored_fp8_scales(col_scales, wgrad_spec)),
            ),
        )
    pair = (
        fprop_spec.format == wgrad_spec.format == "nvfp4"
        and fprop_spec.rounding == wgrad_spec.rounding == "rne"
        and tuple(fprop_spec.tile) == (1, nvfp4.BLOCK)
        and not fprop_spec.rht_dim
        and not fprop_spec.nvfp4_options
        and prologue is None
    )
    if not (pair and x2d.ndim == 2 and x2d.shape[1] == k_f and operands._fused_wgrad_rht(x2d.t(), wgrad_spec, k_w)):
        return None
    (values, scale), q = nvfp4.quantize_rowwise_and_rht_t(
        x2d, "rne", None, rht_signs, rowwise_dense=True, out_dtype=torch.bfloat16, impl=operands.QUANT_IMPL
    )
    packed = operands.Packed(
        operands.PackedLayout(wgrad_spec, tuple(q.shape)), (q.codes, q.scales, q.amax, q.global_decode_scale)
    )
    return operands.Quantized(values, scale), packed


def _fp8_pair(row_spec: OperandSpec, col_spec: OperandSpec) -> bool:
    """FP8 1x128 blocks along K for both (the same format and scale rule, no RHT, RNE): blockwise FP8's
    activation or gradient pair (along features for Fprop / Dgrad, along tokens for Wgrad)."""
    return (
        row_spec.format == col_spec.format
        and row_spec.format in ("fp8_e4m3", "fp8_e5m2")
        and row_spec.tile is not None
        and col_spec.tile is not None
        and tuple(row_spec.tile) == tuple(col_spec.tile) == (1, 128)
        and row_spec.scale_mode == col_spec.scale_mode
        and not row_spec.rht_dim
        and not col_spec.rht_dim
        and row_spec.rounding == col_spec.rounding == "rne"
    )


def _fp8_rowcol_fits(x2d: torch.Tensor, k_row: int, k_col: int) -> bool:
    """The row copy may be K-padded (the kernel writes the zeros), the column copy not (its K is the tokens)."""
    return (
        x2d.ndim == 2
        and x2d.is_contiguous()
        and x2d.shape[1] <= k_row
        and x2d.shape[0] == k_col
        and k_row % 128 == 0
        and k_col % 128 == 0
        and x2d.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


def _fp8_rowcol(x2d: torch.Tensor, spec: OperandSpec, k_row: int, prologue=None, act_input=None):
    return fp8.quantize_blockwise_rowcol(
        x2d,
        operands.operand_format(spec).dtype,
        spec.scale_mode == "pow2",
        row_width=k_row,
        prologue=prologue,
        act_input=act_input,
        impl=operands.QUANT_IMPL,
    )


def takes_prologue(row_spec: OperandSpec, col_spec: OperandSpec) -> bool:
    """Whether a pair of operands of one tensor (X's or dY's) is quantized by kernels that apply a prologue as they
    read it (`fprop_and_wgrad_x`, `dgrad_and_wgrad_dy`): the FP8 pairs, blockwise or per tensor."""
    return _fp8_pair(row_spec, col_spec) or tensorwise_pair(row_spec, col_spec)


def tensorwise_pair(a: OperandSpec, b: OperandSpec) -> bool:
    """Per-tensor FP8 for both, the same spec: the second operand is the first's codes transposed."""
    return a == b and a.format in ("fp8_e4m3", "fp8_e5m2") and a.tile is None and not a.rht_dim


def tensorwise_rowcol(
    x2d: torch.Tensor, spec: OperandSpec, k_row: int, k_col: int, prologue=None, act_input=None
) -> tuple[operands.Quantized, operands.Packed] | None:
    """Per-tensor FP8 of x2d [rows, K] (raw form) and its packed transpose [K, rows] from one cast
    (fp8.quantize_tensorwise_rowcol; of activation.apply(prologue, x2d, act_input) with a prologue); None where
    either would be padded (k_row != K or k_col != rows)."""
    if not (
        x2d.ndim == 2
        and x2d.shape[1] == k_row
        and x2d.shape[0] == k_col
        and x2d.dtype in (torch.float32, torch.bfloat16, torch.float16)
    ):
        return None
    fmt = operands.operand_format(spec)
    (data, decode), (data_t, _) = fp8.quantize_tensorwise_rowcol(
        x2d, fmt.dtype, prologue=prologue, act_input=act_input, impl=operands.QUANT_IMPL
    )
    # (a copy of the 0-d scale for the second: a custom op may not return one tensor twice)
    return (
        fmt.dequantize((data, decode), spec, tuple(x2d.shape)),
        operands.Packed(operands.PackedLayout(spec, tuple(data_t.shape)), (data_t, decode.clone())),
    )


def weight_and_transpose(
    w: torch.Tensor, spec: OperandSpec, k_row: int, k_col: int
) -> tuple[operands.Packed, operands.Quantized] | None:
    """Fprop's packed W [out_p, k_row] and Dgrad's Wᵀ operand [k_row, k_col] (its rows past in_features marked
    as padding) of a 128x128-tiled FP8 weight from one read of W (fp8.quantize_tiles_rowcol): the bits
    `operands.pack` gives W and the same codes and scales transposed, Dgrad's K zero-padded to k_col (as
    `ops._transposed_weight` makes them from Fprop's). None for any other spec (or widths the tiles do not
    fit): quantize W alone."""
    out_f, in_f = w.shape
    if not (
        spec.format in ("fp8_e4m3", "fp8_e5m2")
        and spec.tile is not None
        and tuple(spec.tile) == (128, 128)
        and not spec.rht_dim
        and w.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and k_row % 128 == 0
        and k_row >= in_f
        and k_col % 128 == 0
        and k_col >= out_f
    ):
        return None
    fmt = operands.operand_format(spec)
    (data, scales), (data_t, scales_t) = fp8.quantize_tiles_rowcol(
        w, fmt.dtype, spec.scale_mode == "pow2", row_width=k_row, col_width=k_col, impl=operands.QUANT_IMPL
    )
    packed = operands.Packed(operands.PackedLayout(spec, tuple(data.shape)), (data, scales))
    return packed, operands.Quantized(None, None, data_t, scales_t, spec, rows=in_f)


def four_over_six_weight_pair(fprop_spec: OperandSpec, dgrad_spec: OperandSpec) -> bool:
    """Whether Fprop's W and Dgrad's Wᵀ are a 4over6 weight's two copies (NVFP4 16x16 tiles under 4over6, RNE, no
    RHT, the same spec for both): not each other's transpose (TE sums a tile's errors along its rows for W, along
    its columns for Wᵀ, which can choose another candidate), but made from the same tile maxima, candidates and
    element errors, so one pass gives both (`weight_pair`)."""
    return (
        fprop_spec == dgrad_spec
        and fprop_spec.format == "nvfp4"
        and fprop_spec.tile is not None
        and tuple(fprop_spec.tile) == (16, 16)
        and bool(fprop_spec.four_over_six)
        and not fprop_spec.row_scaled
        and not fprop_spec.rht_dim
        and fprop_spec.rounding == "rne"
    )


def weight_pair(
    w: torch.Tensor, spec: OperandSpec, k_row: int, k_col: int
) -> tuple[operands.Quantized, operands.Quantized] | None:
    """Fprop's W operand [out_p, k_row] and Dgrad's Wᵀ operand [in, k_col] of a `four_over_six_weight_pair` weight
    from one read of W (nvfp4.quantize_tiles_rowcol: one Triton kernel on CUDA, the PyTorch reference elsewhere):
    the bits `operands.fake_quantize(w, spec, k_row)` and `operands.fake_quantize(w.t(), spec, k_col)
    .first_rows(in)` give. None for any other spec or widths the tiles do not fit: quantize them separately."""
    out_f, in_f = w.shape
    if not (
        four_over_six_weight_pair(spec, spec)
        and w.ndim == 2
        and w.dtype in nvfp4.INPUT_DTYPES
        and k_row % nvfp4.BLOCK == 0
        and k_row >= in_f
        and k_col % nvfp4.BLOCK == 0
        and k_col >= out_f
    ):
        return None
    (values, s_dec), (values_t, s_dec_t) = nvfp4.quantize_tiles_rowcol(
        w,
        spec.four_over_six,
        spec.scale_bound,
        dense=True,
        out_dtype=torch.bfloat16,
        row_width=k_row,
        col_width=k_col,
        impl=operands.QUANT_IMPL,
    )
    return operands.Quantized(values, s_dec), operands.Quantized(values_t, s_dec_t).first_rows(in_f)


def dy_pair(dgrad_spec: OperandSpec, wgrad_spec: OperandSpec) -> bool:
    """Whether Dgrad's dY and Wgrad's dYᵀ are a pair quantized from one read of dY: the paper's NVFP4
    pair (1x16; 1x16 after the 16-point RHT along tokens; the same rounding), blockwise FP8's (1x128
    along features; 1x128 along tokens) or per-tensor FP8's (the same spec: Wgrad's is Dgrad's codes
    transposed)."""
    return (
        _fp8_pair(dgrad_spec, wgrad_spec)
        or tensorwise_pair(dgrad_spec, wgrad_spec)
        or (
            dgrad_spec.format == wgrad_spec.format == "nvfp4"
            and dgrad_spec.rounding == wgrad_spec.rounding
            and tuple(dgrad_spec.tile) == (1, nvfp4.BLOCK)
            and not dgrad_spec.rht_dim
            and wgrad_spec.rht_dim == nvfp4.BLOCK
            and tuple(wgrad_spec.tile) == (1, nvfp4.BLOCK)
        )
    )


def operand_tensors(q: operands.Quantized, spec: OperandSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """A ready GEMM operand as two tensors to pass between ops: FP8 its raw form (data and its block
    scales, or its per-tensor decode scale), NVFP4 its dense values and global decode scale.
    `ready_operand` rebuilds it."""
    if spec.format.startswith("fp8"):
        return q.fp8_data, (operands.stored_fp8_scales(q.fp8_scales, spec) if spec.tile is not None else q.decode_scale)
    return q.values, q.decode_scale


def ready_operand(tensors, spec: OperandSpec) -> operands.Quantized:
    if spec.format.startswith("fp8"):
        return operands.operand_format(spec).dequantize(tuple(tensors), spec, tuple(tensors[0].shape))
    return operands.Quantized(tensors[0], tensors[1])


def dgrad_and_wgrad_dy(
    dy2d: torch.Tensor,
    dgrad_spec: OperandSpec,
    wgrad_spec: OperandSpec,
    k_d: int,
    k_w: int,
    rht_signs,
    dgrad_generator,
    wgrad_generator,
    prologue: str | None = None,
    act_input: torch.Tensor | None = None,
) -> tuple[operands.Quantized, operands.Quantized] | None:
    """Dgrad's and Wgrad's dY operands from one read of dY, for `dy_pair` specs and nothing to pad: the
    bits of the two separate quantizations. Per-tensor FP8: Wgrad's is Dgrad's codes transposed, both from one
    cast (fp8.quantize_tensorwise_rowcol; any device).
    NVFP4 (dense values, with the Triton kernel only): SR
    included, each copy's Philox seed drawn from its own role's generator as the separate kernels draw
    it (the PyTorch reference draws SR bits differently, so there: None). FP8 (raw form): RNE, any
    device. None otherwise: quantize them separately. `prologue` (formats.activation, with its `act_input`; the
    FP8 pairs only, None for the others): both operands are of activation.apply(prologue, dY, act_input)."""
    from nvfp4train.formats.impl import use_triton

    if tensorwise_pair(dgrad_spec, wgrad_spec):
        both = tensorwise_rowcol(dy2d, dgrad_spec, k_d, k_w, prologue, act_input)
        return None if both is None else (both[0], both[1].dequantize())
    if _fp8_pair(dgrad_spec, wgrad_spec):
        if not _fp8_rowcol_fits(dy2d, k_d, k_w):
            return None
        (row_data, row_scales), (col_data, col_scales) = _fp8_rowcol(dy2d, dgrad_spec, k_d, prologue, act_input)
        return (
            operands.Quantized(None, None, row_data, row_scales, dgrad_spec),
            operands.Quantized(None, None, col_data, col_scales, wgrad_spec),
        )
    if not (
        prologue is None
        and dy_pair(dgrad_spec, wgrad_spec)
        and dy2d.ndim == 2
        and dy2d.shape[1] == k_d
        and operands._fused_wgrad_rht(dy2d.t(), wgrad_spec, k_w)
        and use_triton(dy2d, operands.QUANT_IMPL, "dgrad_and_wgrad_dy")
    ):
        return None
    row, col = nvfp4.quantize_rowwise_and_rht_t(
        dy2d,
        dgrad_spec.rounding,
        dgrad_generator,
        rht_signs,
        rowwise_dense=True,
        columnwise_dense=True,
        out_dtype=torch.bfloat16,
        impl="triton",
        columnwise_generator=wgrad_generator,
    )
    return operands.Quantized(*row), operands.Quantized(*col)
