"""Quantize one GEMM operand as an `OperandSpec` says, on top of `nvfp4train.formats`.

An operand is a 2-D tensor in its GEMM layout [rows, K]. Quantizing it gives
`values` (the exact part: e2m1 x block scale for NVFP4, the FP8 data for per-tensor FP8, the
dequantized numbers for MXFP4 / blockwise FP8) plus an FP32 `decode_scale` that the GEMM applies
to its FP32 output afterwards, as the hardware epilogue does (arXiv 2509.25149, eq. 5).

Shapes the format's tiles do not divide are zero-padded: K up to `k_pad` (chosen per GEMM so both
operands agree; padded K contributes zero to the product, also after an RHT, which is orthogonal
and applied to both operands alike), rows up to the tile's row count (cropped again on use).

Two forms:
* `fake_quantize` -> `Quantized` with dense `values` (fast; for operands used at once);
* `pack` -> `Packed` holding the packed tensors only (4-bit codes + scales for NVFP4/MXFP4, FP8
  data + scales for FP8), for operands saved between forward and backward. `Packed.tensors`
  and `Packed.rebuild` let autograd's `save_for_backward` see (and count) exactly those tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4train.formats import fp8, hadamard, mxfp4, nvfp4

from .policy import OperandSpec

FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad2d(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor to [rows, cols] (no copy when nothing is padded)."""
    pr, pc = rows - x.shape[0], cols - x.shape[1]
    if pr == 0 and pc == 0:
        return x
    return torch.nn.functional.pad(x, (0, pc, 0, pr))


def _prepare(x: torch.Tensor, spec: OperandSpec, k_pad: int, rht_signs) -> torch.Tensor:
    """Pad to the tile grid (rows) and k_pad (K), then apply the RHT along K if asked."""
    rows = round_up(x.shape[0], spec.row_block)
    x = pad2d(x, rows, k_pad)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        x = x.float()
    if spec.rht_dim:
        x = hadamard.rht(x, d=spec.rht_dim, signs=rht_signs)
    return x.contiguous()


@dataclass
class Quantized:
    """Dense quantized operand: `values` [rows_padded, k_pad] (exact in bf16 except blockwise
    FP8 with FP32 scales, which stays FP32) and the FP32 0-d `decode_scale`."""
    values: torch.Tensor
    decode_scale: torch.Tensor | None
    fp8_data: torch.Tensor | None = None  # per-tensor FP8 only: the raw data, for torch._scaled_mm

    def first_rows(self, n: int) -> "Quantized":
        """Drop the rows a tile padded on (the K padding stays: it multiplies zeros)."""
        data = self.fp8_data[:n] if self.fp8_data is not None else None
        return Quantized(self.values[:n], self.decode_scale, data)


def fake_quantize(x: torch.Tensor, spec: OperandSpec, k_pad: int, generator=None, rht_signs=None) -> Quantized:
    """Quantize `x` [rows, K] to dense values, K zero-padded to `k_pad`."""
    if spec.is_bf16:
        return Quantized(pad2d(x.to(torch.bfloat16), x.shape[0], k_pad), None)
    xp = _prepare(x, spec, k_pad, rht_signs)
    fmt = spec.format
    if fmt == "nvfp4":
        values, scale = nvfp4.fake_quantize(xp, spec.tile, spec.rounding, generator, out_dtype=torch.bfloat16)
        return Quantized(values, scale)
    if fmt == "mxfp4":
        values, scale = mxfp4.fake_quantize(xp, spec.rounding, spec.scale_mode, generator, out_dtype=torch.bfloat16)
        return Quantized(values, None)
    if fmt in FP8_DTYPES:
        if spec.tile is None:
            data, scale = fp8.quantize_tensorwise(xp, FP8_DTYPES[fmt])
            return Quantized(data.to(torch.bfloat16), scale, fp8_data=data)
        pow2 = spec.scale_mode == "pow2"
        values, _ = fp8.fake_quantize_blockwise(xp, spec.tile, FP8_DTYPES[fmt], pow2_scales=pow2,
                                                out_dtype=torch.bfloat16 if pow2 else torch.float32)
        return Quantized(values, None)
    raise ValueError(f"unknown operand format {fmt!r}")


@dataclass
class Packed:
    """A quantized operand in its storage form (what is saved for backward)."""
    spec: OperandSpec
    tensors: tuple[torch.Tensor, ...]
    shape: tuple[int, int]  # padded logical shape [rows_padded, k_pad]

    def rebuild(self, tensors) -> "Packed":
        return Packed(self.spec, tuple(tensors), self.shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def dequantize(self) -> Quantized:
        """Dense values (without the global scale) + decode scale; same numbers as fake_quantize."""
        spec, t = self.spec, self.tensors
        fmt = spec.format
        if spec.is_bf16:
            return Quantized(t[0], None)
        if fmt == "nvfp4":
            codes, scales, amax, s_dec = t
            q = nvfp4.NVFP4Tensor(codes, scales, amax, s_dec, torch.Size(self.shape), spec.tile)
            return Quantized(q.dequantize(torch.bfloat16, apply_global_scale=False), s_dec)
        if fmt == "mxfp4":
            codes, scales = t
            q = mxfp4.MXFP4Tensor(codes, scales, torch.Size(self.shape), spec.scale_mode)
            return Quantized(q.dequantize(torch.bfloat16), None)
        if spec.tile is None:
            data, scale = t
            return Quantized(data.to(torch.bfloat16), scale, fp8_data=data)
        data, scales = t
        out = torch.bfloat16 if spec.scale_mode == "pow2" else torch.float32
        return Quantized(fp8.dequantize_blockwise(data, scales, spec.tile, out), None)


def pack(x: torch.Tensor, spec: OperandSpec, k_pad: int, generator=None, rht_signs=None) -> Packed:
    """Quantize `x` [rows, K] to its packed storage form, K zero-padded to `k_pad`."""
    if spec.is_bf16:
        values = pad2d(x.to(torch.bfloat16), x.shape[0], k_pad)
        return Packed(spec, (values,), tuple(values.shape))
    xp = _prepare(x, spec, k_pad, rht_signs)
    shape = tuple(xp.shape)
    fmt = spec.format
    if fmt == "nvfp4":
        q = nvfp4.quantize(xp, spec.tile, spec.rounding, generator)
        return Packed(spec, (q.codes, q.scales, q.amax, q.global_decode_scale), shape)
    if fmt == "mxfp4":
        q = mxfp4.quantize(xp, spec.rounding, spec.scale_mode, generator)
        return Packed(spec, (q.codes, q.scales), shape)
    if fmt in FP8_DTYPES:
        if spec.tile is None:
            return Packed(spec, fp8.quantize_tensorwise(xp, FP8_DTYPES[fmt]), shape)
        return Packed(spec, fp8.quantize_blockwise(xp, spec.tile, FP8_DTYPES[fmt], spec.scale_mode == "pow2"), shape)
    raise ValueError(f"unknown operand format {fmt!r}")


def operand_stats(x: torch.Tensor, spec: OperandSpec, packed: Packed, k_pad: int, rht_signs=None) -> dict[str, float]:
    """Telemetry for one quantized operand:
    rel_err     ||x_hat - x|| / ||x|| (x after padding and RHT, i.e. what was quantized);
    flush_zero  fraction of non-zero inputs that quantized to zero;
    scale_sat   fraction of block scales at the scale format's max (NVFP4: E4M3 448);
    scale_uflow fraction of non-zero blocks whose scale underflowed (NVFP4: below the E4M3 normal
                range 2^-6, i.e. subnormal or zero; MXFP4: at E8M0's minimum 2^-127)."""
    ref = _prepare(x, spec, k_pad, rht_signs).float()
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
    fmt = spec.format
    if fmt in ("nvfp4", "mxfp4"):
        block = nvfp4.BLOCK if fmt == "nvfp4" else mxfp4.BLOCK
        block_nonzero = nonzero.reshape(ref.shape[0], -1, block).any(-1).reshape(-1)
        scales = packed.tensors[1].reshape(-1)
        if fmt == "nvfp4":
            s = scales.to(torch.float32)
            sat, uflow = s == nvfp4.E4M3_MAX, s < 2.0**-6
        else:
            bits = scales.view(torch.uint8)
            sat, uflow = bits == 254, bits == 0
        n_blocks = max(int(block_nonzero.sum()), 1)
        stats["scale_sat"] = float((sat & block_nonzero).sum()) / n_blocks
        stats["scale_uflow"] = float((uflow & block_nonzero).sum()) / n_blocks
    elif fmt in FP8_DTYPES:
        # FP8: saturation = elements clipped at the FP8 max (current scaling maps amax to max).
        data = packed.tensors[0].float()
        stats["scale_sat"] = float((data.abs() == fp8.fp8_max(FP8_DTYPES[fmt])).sum()) / n_nonzero
    return stats
