"""Quantize one GEMM operand as an `OperandSpec` says, on top of `nvfp4train.formats`.

An operand is a 2-D tensor in its GEMM layout [rows, K]. Quantizing it gives
`values` (the exact part: e2m1 x block scale for NVFP4, the FP8 data for per-tensor FP8, the
dequantized numbers for MXFP4 / blockwise FP8) plus an FP32 `decode_scale` that the GEMM applies
to its FP32 output afterwards, as the hardware epilogue does (arXiv 2509.25149, eq. 5).

Shapes the format's tiles do not divide are zero-padded: K up to `k_pad` (chosen per GEMM so both
operands agree; padded K contributes zero to the product, also after an RHT, which is orthogonal
and applied to both operands alike), rows up to the tile's row count (cropped again on use).

Each operand format is one `OperandFormat` object in `OPERAND_FORMATS`, looked up by
`OperandSpec.format`: it quantizes, packs, dequantizes, reports its scale statistics and names the
tensor-core rate a native GEMM on it runs at. Adding a format is adding one class here.

Two forms:
* `fake_quantize` -> `Quantized` with dense `values` (fast; for operands used at once);
* `pack` -> `Packed` holding the packed tensors only (4-bit codes + scales for NVFP4/MXFP4, FP8
  data + scales for FP8, 1 x 128 block scales block-major: `stored_fp8_scales`), for operands saved
  between forward and backward. `Packed.tensors`
  go through autograd's `save_for_backward`; `Packed.layout` is the tensor-free rest, and
  `layout.rebuild(tensors)` puts the two together again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nvfp4train.formats import fp8, hadamard, mxfp4, nvfp4

from .recipe import OperandSpec

# Which implementation of nvfp4train.formats quantizes operands: "auto" runs the fused Triton
# kernels on CUDA tensors and the PyTorch reference elsewhere (same bits; formats/impl.py).
QUANT_IMPL = "auto"


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad2d(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor to [rows, cols] (no copy when nothing is padded)."""
    pr, pc = rows - x.shape[0], cols - x.shape[1]
    if pr == 0 and pc == 0:
        return x
    return torch.nn.functional.pad(x, (0, pc, 0, pr))


class Quantized:
    """Dense quantized operand: `values` [rows_padded, k_pad] (exact in bf16 except blockwise
    FP8 with FP32 scales, which stays FP32) and the FP32 0-d `decode_scale`.

    FP8 operands also carry their raw form for FP8 tensor cores (`fp8_data` [rows_padded, k_pad],
    `fp8_scales`: None per tensor, else the FP32 block decode scales [rows / tile rows, K / 128], for 1 x 128
    blocks a transposed view of the stored layout: `stored_fp8_scales`); their `values` are then made
    from it on first use (a scaled_mm GEMM never asks). `rows` < the padded row count marks the
    rows a tile padded on: `values` drops them, the raw form keeps them (a GEMM crops its output)."""

    def __init__(
        self,
        values: torch.Tensor | None,
        decode_scale: torch.Tensor | None,
        fp8_data: torch.Tensor | None = None,
        fp8_scales: torch.Tensor | None = None,
        spec: OperandSpec | None = None,
        rows: int | None = None,
    ):
        self._values, self.decode_scale = values, decode_scale
        self.fp8_data, self.fp8_scales, self.spec, self.rows = fp8_data, fp8_scales, spec, rows

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            self._values = operand_format(self.spec).dense(self)
        return self._values if self.rows is None else self._values[: self.rows]

    def first_rows(self, n: int) -> Quantized:
        """Drop the rows a tile padded on (the K padding stays: it multiplies zeros)."""
        if self.fp8_data is None:
            return Quantized(self.values[:n], self.decode_scale)
        rows = n if self.rows is None else min(n, self.rows)
        return Quantized(self._values, self.decode_scale, self.fp8_data, self.fp8_scales, self.spec, rows)


# ---------------------------------------------------------------------------------- formats
class OperandFormat:
    """How operands of one format are quantized. `gemm_peak` is the tensor-core rate ("bf16" |
    "fp8" | "fp4") a GEMM that consumes this format natively runs at; the emulated backend runs
    every format as BF16 GEMMs (see `backends.gemm_peak_kind`)."""

    name: str
    gemm_peak: str

    def prepare(self, x: torch.Tensor, spec: OperandSpec, k_pad: int, rht_signs) -> torch.Tensor:
        """Pad to the tile grid (rows) and k_pad (K), then apply the RHT along K if asked."""
        x = pad2d(x, round_up(x.shape[0], spec.row_block), k_pad)
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            x = x.float()
        if spec.rht_dim:
            x = hadamard.rht(x, d=spec.rht_dim, signs=rht_signs, impl=QUANT_IMPL)
        return x.contiguous()

    def fake_quantize(self, x: torch.Tensor, spec: OperandSpec, generator) -> Quantized:
        """Dense values of the prepared operand `x`."""
        raise NotImplementedError

    def pack(self, x: torch.Tensor, spec: OperandSpec, generator) -> tuple[torch.Tensor, ...]:
        """The storage tensors of the prepared operand `x`."""
        raise NotImplementedError

    def dequantize(self, tensors, spec: OperandSpec, shape: tuple[int, int]) -> Quantized:
        """`pack`'s tensors back to dense values: the same numbers as `fake_quantize`."""
        raise NotImplementedError

    def storage(self, spec: OperandSpec, shape: tuple[int, int]) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor `pack` returns for a prepared operand of `shape` (what the
        custom ops' fake implementations allocate)."""
        raise NotImplementedError

    def scale_stats(self, tensors, spec: OperandSpec, nonzero: torch.Tensor) -> dict[str, float]:
        """Saturation / underflow fractions of `pack`'s tensors (`nonzero`: the inputs that were)."""
        return {}

    def dense(self, q: Quantized) -> torch.Tensor:
        """The dense values of an operand held in raw form (FP8 only)."""
        raise NotImplementedError


class BF16Format(OperandFormat):
    """Not quantized: the operand in BF16, K zero-padded (no tile, no RHT)."""

    name, gemm_peak = "bf16", "bf16"

    def prepare(self, x, spec, k_pad, rht_signs):
        return pad2d(x.to(torch.bfloat16), x.shape[0], k_pad)

    def fake_quantize(self, x, spec, generator):
        return Quantized(x, None)

    def pack(self, x, spec, generator):
        return (x,)

    def dequantize(self, tensors, spec, shape):
        return Quantized(tensors[0], None)

    def storage(self, spec, shape):
        return [(shape, torch.bfloat16)]


class _E2M1BlockFormat(OperandFormat):
    """NVFP4 / MXFP4: E2M1 codes with one scale per `block` elements along K."""

    gemm_peak = "fp4"
    block: int
    quantizer: Any  # the formats module (nvfp4 | mxfp4): its quantize / fake_quantize take the same arguments

    def quantizer_args(self, spec) -> tuple:
        """What the format's quantizers take between x and the generator."""
        raise NotImplementedError

    def fake_quantize(self, x, spec, generator):
        values, decode_scale = self.quantizer.fake_quantize(
            x,
            *self.quantizer_args(spec),
            generator,
            out_dtype=torch.bfloat16,
            impl=QUANT_IMPL,
            **spec.nvfp4_options,
        )
        return Quantized(values, decode_scale if self.global_scale else None)

    def pack(self, x, spec, generator):
        q = self.quantizer.quantize(x, *self.quantizer_args(spec), generator, impl=QUANT_IMPL, **spec.nvfp4_options)
        return self.tensors(q)

    def tensors(self, q) -> tuple:
        """The quantized tensor's stored parts (`storage` lists their shapes)."""
        raise NotImplementedError

    def scale_flags(self, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(saturated, underflowed) per block scale."""
        raise NotImplementedError

    def scale_stats(self, tensors, spec, nonzero):
        block_nonzero = nonzero.reshape(nonzero.shape[0], -1, self.block).any(-1).reshape(-1)
        sat, uflow = self.scale_flags(tensors[1].reshape(-1))
        n_blocks = max(int(block_nonzero.sum()), 1)
        return {
            "scale_sat": float((sat & block_nonzero).sum()) / n_blocks,
            "scale_uflow": float((uflow & block_nonzero).sum()) / n_blocks,
        }


class NVFP4Format(_E2M1BlockFormat):
    name, block, quantizer, global_scale = "nvfp4", nvfp4.BLOCK, nvfp4, True

    def quantizer_args(self, spec):
        return spec.tile, spec.rounding

    def tensors(self, q):
        return q.codes, q.scales, q.amax, q.global_decode_scale

    def dequantize(self, tensors, spec, shape):
        codes, scales, amax, s_dec = tensors
        q = nvfp4.NVFP4Tensor(codes, scales, amax, s_dec, torch.Size(shape), spec.tile)
        return Quantized(q.dequantize(torch.bfloat16, apply_global_scale=False, impl=QUANT_IMPL), s_dec)

    def storage(self, spec, shape):
        rows, k = shape
        return [
            ((rows, k // 2), torch.uint8),
            ((rows, k // self.block), torch.float8_e4m3fn),
            ((rows, 1) if spec.row_scaled else (), torch.float32),
            ((rows, 1) if spec.row_scaled else (), torch.float32),
        ]

    def scale_flags(self, scales):
        # Underflow: below the E4M3 normal range 2^-6 (subnormal or zero).
        s = scales.to(torch.float32)
        return s == nvfp4.E4M3_MAX, s < 2.0**-6


class MXFP4Format(_E2M1BlockFormat):
    name, block, quantizer, global_scale = "mxfp4", mxfp4.BLOCK, mxfp4, False  # E8M0 scales: no global one

    def quantizer_args(self, spec):
        return spec.rounding, spec.scale_mode

    def tensors(self, q):
        return q.codes, q.scales

    def dequantize(self, tensors, spec, shape):
        codes, scales = tensors
        q = mxfp4.MXFP4Tensor(codes, scales, torch.Size(shape), spec.scale_mode)
        return Quantized(q.dequantize(torch.bfloat16, impl=QUANT_IMPL), None)

    def storage(self, spec, shape):
        rows, k = shape
        return [((rows, k // 2), torch.uint8), ((rows, k // self.block), torch.float8_e8m0fnu)]

    def scale_flags(self, scales):
        # E8M0 bits: 254 is the largest finite scale 2^127, 0 the smallest 2^-127.
        bits = scales.view(torch.uint8)
        return bits == 254, bits == 0


def stored_fp8_scales(scales: torch.Tensor, spec: OperandSpec) -> torch.Tensor:
    """FP8 block scales between their logical layout (`Quantized.fp8_scales`: [rows, K / 128]) and the one they
    are stored and passed between ops in (either way: the map is its own inverse). Scales of 1 x 128 blocks are
    stored as [K / 128, rows], rows contiguous: the layout torch._scaled_mm reads them in, and the one the rowcol
    kernels write (`fp8.quantize_blockwise_rowcol`'s scales are views of it), so no op copies them on the way.
    128 x 128 tile scales are stored as they are."""
    return scales.t() if _block_major_scales(spec) else scales


def _block_major_scales(spec: OperandSpec) -> bool:
    return spec.tile is not None and spec.tile[0] == 1


class FP8Format(OperandFormat):
    """FP8 with current scaling: per tensor when the spec has no tile, else blockwise with FP32
    scales (power-of-two when `scale_mode` is "pow2")."""

    gemm_peak = "fp8"

    def __init__(self, name: str, dtype: torch.dtype):
        self.name, self.dtype = name, dtype

    @staticmethod
    def _blockwise_dtype(spec) -> torch.dtype:
        # Power-of-two scales keep the dequantized values exact in BF16; FP32 scales do not.
        return torch.bfloat16 if spec.scale_mode == "pow2" else torch.float32

    def fake_quantize(self, x, spec, generator):
        return self.dequantize(self.pack(x, spec, generator), spec, tuple(x.shape))

    def pack(self, x, spec, generator):
        if spec.tile is None:
            return fp8.quantize_tensorwise(x, self.dtype, impl=QUANT_IMPL)
        data, scales = fp8.quantize_blockwise(x, spec.tile, self.dtype, spec.scale_mode == "pow2", impl=QUANT_IMPL)
        return data, stored_fp8_scales(scales, spec)

    def dequantize(self, tensors, spec, shape):
        # The raw form; `values` (the FP8 numbers in BF16, or dequantized blocks) on first use.
        data, scales = tensors
        if spec.tile is None:
            return Quantized(None, scales, fp8_data=data, spec=spec)
        return Quantized(None, None, fp8_data=data, fp8_scales=stored_fp8_scales(scales, spec), spec=spec)

    def storage(self, spec, shape):
        rows, k = shape
        if spec.tile is None:
            scales = ()
        elif _block_major_scales(spec):
            scales = (k // spec.tile[1], rows)
        else:
            scales = (rows // spec.tile[0], k // spec.tile[1])
        return [(shape, self.dtype), (scales, torch.float32)]

    def dense(self, q):
        if q.spec.tile is None:
            return q.fp8_data.to(torch.bfloat16)
        return fp8.dequantize_blockwise(
            q.fp8_data, q.fp8_scales, q.spec.tile, self._blockwise_dtype(q.spec), impl=QUANT_IMPL
        )

    def scale_stats(self, tensors, spec, nonzero):
        # Saturation = elements clipped at the FP8 max (current scaling maps amax to max).
        at_max = tensors[0].float().abs() == fp8.fp8_max(self.dtype)
        return {"scale_sat": float(at_max.sum()) / max(int(nonzero.sum()), 1)}


OPERAND_FORMATS: dict[str, OperandFormat] = {
    f.name: f
    for f in (
        BF16Format(),
        NVFP4Format(),
        MXFP4Format(),
        FP8Format("fp8_e4m3", torch.float8_e4m3fn),
        FP8Format("fp8_e5m2", torch.float8_e5m2),
    )
}


def operand_format(spec: OperandSpec) -> OperandFormat:
    try:
        return OPERAND_FORMATS[spec.format]
    except KeyError:
        raise ValueError(f"unknown operand format {spec.format!r}; known: {sorted(OPERAND_FORMATS)}") from None


# ---------------------------------------------------------------------------------- operands
def _fused_wgrad_rht(x: torch.Tensor, spec: OperandSpec, k_pad: int) -> bool:
    """Whether `x` is a Wgrad operand with a fused RHT + transpose + quantize entry
    (nvfp4.rht_quantize_t for NVFP4 1x16 with the 16-point RHT along K, mxfp4.rht_quantize_t for
    MXFP4 1x32 with the 32-point one): `x` [rows, K] the transpose of a contiguous [K, rows]
    tensor (the layer passes x2d.t()), and nothing to pad. Same bits as prepare + quantize; on
    CUDA one kernel reads x row-major instead of materializing x.T and its transform."""
    block = {"nvfp4": nvfp4.BLOCK, "mxfp4": mxfp4.BLOCK}.get(spec.format)
    return (
        block is not None
        and spec.rht_dim == block
        and tuple(spec.tile) == (1, block)
        and x.ndim == 2
        and x.shape[1] == k_pad
        and k_pad % block == 0
        and x.t().is_contiguous()
        and x.dtype in nvfp4.INPUT_DTYPES
    )


def _fused_fp8_columnwise(x: torch.Tensor, spec: OperandSpec, k_pad: int) -> bool:
    """Whether `x` is a Wgrad operand of blockwise FP8 (1x128 blocks along K = tokens, no RHT) with a
    fused transpose + quantize entry (fp8.quantize_blockwise_t): `x` [rows, K] the transpose of a
    contiguous [K, rows] tensor, nothing to pad. Same bits as prepare + quantize; on CUDA one kernel
    reads x row-major instead of materializing x.T."""
    return (
        spec.format in ("fp8_e4m3", "fp8_e5m2")
        and spec.tile is not None
        and tuple(spec.tile) == (1, 128)
        and not spec.rht_dim
        and x.ndim == 2
        and x.shape[1] == k_pad
        and k_pad % 128 == 0
        and x.t().is_contiguous()
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


def _fp8_columnwise(x: torch.Tensor, spec: OperandSpec) -> tuple[torch.Tensor, torch.Tensor]:
    data, scales = fp8.quantize_blockwise_t(
        x.t(), operand_format(spec).dtype, spec.scale_mode == "pow2", impl=QUANT_IMPL
    )
    return data, stored_fp8_scales(scales, spec)


def packed_shapes(spec: OperandSpec, shape: tuple[int, int]) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each tensor `pack` returns for an operand whose prepared (padded) shape
    is `shape`."""
    return operand_format(spec).storage(spec, shape)


def fake_quantize(x: torch.Tensor, spec: OperandSpec, k_pad: int, generator=None, rht_signs=None) -> Quantized:
    """Quantize `x` [rows, K] to dense values, K zero-padded to `k_pad`."""
    if _fused_wgrad_rht(x, spec, k_pad):
        if spec.format == "nvfp4":
            values, scale = nvfp4.rht_fake_quantize_t(
                x.t(), spec.rounding, generator, rht_signs, torch.bfloat16, impl=QUANT_IMPL
            )
            return Quantized(values, scale)
        values, _ = mxfp4.rht_fake_quantize_t(
            x.t(), spec.rounding, generator, rht_signs, spec.scale_mode, torch.bfloat16, impl=QUANT_IMPL
        )
        return Quantized(values, None)  # as MXFP4Format.fake_quantize: no global scale
    if _fused_fp8_columnwise(x, spec, k_pad):
        return operand_format(spec).dequantize(_fp8_columnwise(x, spec), spec, tuple(x.shape))
    fmt = operand_format(spec)
    return fmt.fake_quantize(fmt.prepare(x, spec, k_pad, rht_signs), spec, generator)


@dataclass(frozen=True)
class PackedLayout:
    """Everything about a packed operand but its tensors (safe to keep on an autograd ctx)."""

    spec: OperandSpec
    shape: tuple[int, int]  # padded logical shape [rows_padded, k_pad]

    def rebuild(self, tensors) -> Packed:
        return Packed(self, tuple(tensors))


@dataclass
class Packed:
    """A quantized operand in its storage form (what is saved for backward)."""

    layout: PackedLayout
    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def dequantize(self) -> Quantized:
        """Dense values (without the global scale) + decode scale; same numbers as fake_quantize."""
        spec = self.layout.spec
        return operand_format(spec).dequantize(self.tensors, spec, self.layout.shape)


def pack(x: torch.Tensor, spec: OperandSpec, k_pad: int, generator=None, rht_signs=None) -> Packed:
    """Quantize `x` [rows, K] to its packed storage form, K zero-padded to `k_pad`."""
    if _fused_wgrad_rht(x, spec, k_pad):
        if spec.format == "nvfp4":
            q = nvfp4.rht_quantize_t(x.t(), spec.rounding, generator, rht_signs, impl=QUANT_IMPL)
            return Packed(PackedLayout(spec, tuple(q.shape)), (q.codes, q.scales, q.amax, q.global_decode_scale))
        q = mxfp4.rht_quantize_t(x.t(), spec.rounding, generator, rht_signs, spec.scale_mode, impl=QUANT_IMPL)
        return Packed(PackedLayout(spec, tuple(q.shape)), (q.codes, q.scales))
    if _fused_fp8_columnwise(x, spec, k_pad):
        return Packed(PackedLayout(spec, tuple(x.shape)), _fp8_columnwise(x, spec))
    fmt = operand_format(spec)
    xp = fmt.prepare(x, spec, k_pad, rht_signs)
    return Packed(PackedLayout(spec, tuple(xp.shape)), tuple(fmt.pack(xp, spec, generator)))


def operand_stats(x: torch.Tensor, spec: OperandSpec, packed: Packed, k_pad: int, rht_signs=None) -> dict[str, float]:
    """Telemetry for one quantized operand:
    rel_err     ||x_hat - x|| / ||x|| (x after padding and RHT, i.e. what was quantized);
    flush_zero  fraction of non-zero inputs that quantized to zero;
    scale_sat   fraction of block scales at the scale format's max (NVFP4: E4M3 448; FP8: of
                elements at the FP8 max);
    scale_uflow fraction of non-zero blocks whose scale underflowed (NVFP4: below the E4M3 normal
                range 2^-6, i.e. subnormal or zero; MXFP4: at E8M0's minimum 2^-127)."""
    fmt = operand_format(spec)
    ref = fmt.prepare(x, spec, k_pad, rht_signs).float()
    q = packed.dequantize()
    xhat = q.values[: ref.shape[0]].float()
    if q.decode_scale is not None:
        xhat = xhat * q.decode_scale
    nonzero = ref != 0
    n_nonzero = max(int(nonzero.sum()), 1)
    stats = {
        "rel_err": float((xhat - ref).norm() / ref.norm().clamp_min(1e-30)),
        "flush_zero": float((nonzero & (xhat == 0)).sum()) / n_nonzero,
    }
    stats.update(fmt.scale_stats(packed.tensors, spec, nonzero))
    return stats
