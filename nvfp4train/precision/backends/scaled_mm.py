"""SCALED_MM (FP8 policies on CUDA: per tensor on sm_89+, blockwise on sm_90): the emulated path's own
quantized operands, multiplied on FP8 tensor cores by `torch._scaled_mm`; numerically equivalent to emulated
up to summation order (tests/gpu/test_precision_gpu.py checks it). Whether this GPU's `torch._scaled_mm` runs
the blockwise layouts right is probed once per device (`_blockwise_unsupported`)."""

from __future__ import annotations

import functools

import torch

from nvfp4train.formats import fp8

from ..hardware import cuda_capability
from ..operands import Quantized, pad2d, round_up
from ..recipe import OperandSpec
from .emulated import EmulatedBackend


class ScaledMMBackend(EmulatedBackend):
    """FP8 GEMMs on FP8 tensor cores (`torch._scaled_mm`): per-tensor scales (fp8_tensorwise,
    sm_89+) or DeepSeek-style blocks (fp8_blockwise, sm_90: 1x128 activation/gradient blocks,
    128x128 or 1x128 weight tiles). The operands are the emulated path's own quantized operands in
    their raw form (FP8 data + FP32 decode scales, the same bits); only the GEMM differs, and it
    accumulates in FP32 too. Any other operand pair runs as EMULATED does it."""

    name, native_gemm = "scaled_mm", True

    def unsupported(self, policy):
        if policy.format not in ("fp8_tensorwise", "fp8_blockwise"):
            return (
                f"scaled_mm runs the FP8 policies only (format={str(policy.format)!r}: NVFP4/MXFP4 GEMMs need sm_100)"
            )
        cap = cuda_capability()
        if cap is None:
            return "scaled_mm needs a CUDA GPU (torch.cuda.is_available() is False)"
        if cap < (8, 9):
            return f"scaled_mm needs FP8 tensor cores (sm_89+); this GPU is sm_{cap[0]}{cap[1]}"
        if policy.format == "fp8_blockwise":
            return _blockwise_unsupported(torch.cuda.current_device())
        return None

    def gemm(self, a: Quantized, b: Quantized, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if a.fp8_data is None or b.fp8_data is None or a.fp8_data.device.type != "cuda":
            return super().gemm(a, b, out_dtype)
        # The output in out_dtype straight from cuBLAS's epilogue (its FP32 accumulator rounded once), not
        # an FP32 copy cast afterwards: one pass over the output fewer.
        if a.fp8_scales is None and b.fp8_scales is None:
            return _tensorwise_gemm(a, b, out_dtype)
        if a.fp8_scales is not None and b.fp8_scales is not None and a.spec.tile == (1, 128):
            return _blockwise_gemm(a, b, out_dtype=out_dtype)
        return super().gemm(a, b, out_dtype)


def _rows(q: Quantized) -> int:
    return q.fp8_data.shape[0] if q.rows is None else q.rows


def _pad_rows(t: torch.Tensor, rows: int, value: float = 0.0) -> torch.Tensor:
    """`t` with zero rows (or `value` rows) appended up to `rows`; FP8 padded through its bytes."""
    if t.shape[0] == rows:
        return t
    if t.dtype.itemsize == 1 and t.is_floating_point():
        return pad2d(t.view(torch.uint8), rows, t.shape[1]).view(t.dtype)
    return torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[0]), value=value)


def _tensorwise_gemm(a: Quantized, b: Quantized, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # cuBLASLt wants M, K and N multiples of 16 and b column-major: pad with zeros.
    da, db = a.fp8_data, b.fp8_data
    m, n = _rows(a), _rows(b)
    k = round_up(da.shape[1], 16)
    da = pad2d(da.view(torch.uint8), round_up(da.shape[0], 16), k).view(da.dtype)
    db = pad2d(db.view(torch.uint8), round_up(db.shape[0], 16), k).view(db.dtype)
    out = torch._scaled_mm(
        da,
        db.t(),
        scale_a=a.decode_scale.reshape(()).float(),
        scale_b=b.decode_scale.reshape(()).float(),
        out_dtype=out_dtype,
    )
    return out[:m, :n]


# How the [N/128, K/128] scales of a 128x128-tiled weight are handed to torch._scaled_mm as scale_b.
# cuBLASLt's 1x128 x 128x128 mode reads the K blocks of the tile scales in groups of 4 (pytorch PR #166752:
# "B_scale: [L4, N // 128], stride: [1, L4]" with L4 = K/128 rounded up to 4; without that, "silent
# wrong answers where (K // 128) % 4 != 0"). On an H100 with torch 2.11 (2026-11-24) the transposed view
# [K/128, N/128] of the row-major grid was accepted and exact only where K/128 % 4 == 0: at K/128 = 3 its
# product was off by rel err 1.39, and both padded layouts were refused ("Invalid scaling
# configuration"). So K is zero-padded to a multiple of 512 for this GEMM (padded data 0, padded scales
# 1: the product is unchanged), where every rule above is the same layout. The K of hybrid_repro,
# hybrid_350m, hybrid_1b and the paper's configs (d_model, d_inner, ffn_hidden, heads x head_dim) are
# multiples of 512 already; hybrid_125m (d_model 640) and hybrid_50m (384) pay a padded copy per GEMM.
TILE_K_MULTIPLE = 4 * 128


def gemm_k_multiple(backend_name: str, a: OperandSpec, b: OperandSpec) -> int:
    """The multiple of K that `backend_name`'s GEMM of a [M, K] by b [N, K] wants beyond the operands' own
    blocks: TILE_K_MULTIPLE for scaled_mm on a 128x128-tiled FP8 b, else 1. QuantLinear makes its operands
    at that K, so `_blockwise_gemm` finds nothing left to pad."""
    if (
        backend_name == "scaled_mm"
        and b.format in ("fp8_e4m3", "fp8_e5m2")
        and b.tile is not None
        and tuple(b.tile) == (128, 128)
        and a.format == b.format
    ):
        return TILE_K_MULTIPLE
    return 1


def gemm_out_width(backend_name: str, a: OperandSpec, b: OperandSpec, n: int) -> int:
    """The row length of the buffer `backend_name`'s GEMM of a [M, K] by b [N = n, K] writes, its [M, n] output
    being the first n columns: scaled_mm pads N for cuBLASLt (to b's 128-row tiles for a 128x128-tiled FP8 b,
    else to 16) and returns the output cropped, a view; every other GEMM writes exactly n. (On a CPU tensor
    scaled_mm runs the emulated GEMM: n; a caller that relies on the width checks the stride it got.)"""
    fp8_pair = backend_name == "scaled_mm" and a.format == b.format and b.format in ("fp8_e4m3", "fp8_e5m2")
    if not fp8_pair:
        return n
    if a.tile is None and b.tile is None:
        return round_up(n, 16)  # _tensorwise_gemm
    if a.tile is not None and tuple(a.tile) == (1, 128) and b.tile is not None:
        return round_up(n, 128 if tuple(b.tile) == (128, 128) else 16)  # _blockwise_gemm
    return n


def pad_fp8_k(data: torch.Tensor, scales: torch.Tensor, k_pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 data [R, K] zero-padded to [R, k_pad] and its per-128 scales [R', K/128] padded with ones."""
    k = data.shape[1]
    if k == k_pad:
        return data, scales
    data = pad2d(data.view(torch.uint8), data.shape[0], k_pad).view(data.dtype)
    scales = torch.nn.functional.pad(scales, (0, k_pad // 128 - scales.shape[1]), value=1.0)
    return data, scales


def _blockwise_gemm(a: Quantized, b: Quantized, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """a [M, K] in 1x128 blocks @ b [N, K]ᵀ in 1x128 blocks or 128x128 tiles, in `out_dtype`.

    torch._scaled_mm's layouts (sm_90, torch 2.11): a row-major with scale_a [M, K/128]
    column-major; b given as the transpose of a row-major [N, K], with scale_b [K/128, N]
    column-major (1x128) or the transposed view [K/128, N/128] of the row-major [N/128, K/128] tile
    scales, K padded to a multiple of 512 (128x128; see TILE_K_MULTIPLE).
    M and N are zero-padded to multiples of 16 (cuBLASLt refuses other shapes). With 128x128 tiles N is W's
    padded rows: on the H100 with torch 2.11 (2026-11-25) a row slice of W down to N (a multiple of 16, scale_b
    keeping its last partial tile) was refused ("Invalid scaling configuration"), so the output is cropped."""
    m, n = _rows(a), _rows(b)
    m_pad = round_up(a.fp8_data.shape[0], 16)
    da, sa_rows = _pad_rows(a.fp8_data, m_pad), _pad_rows(a.fp8_scales, m_pad, 1.0)
    if b.spec.tile == (128, 128):  # rows already a multiple of 128
        k_pad = round_up(da.shape[1], TILE_K_MULTIPLE)
        da, sa_rows = pad_fp8_k(da, sa_rows, k_pad)
        db, sb = pad_fp8_k(b.fp8_data, b.fp8_scales.contiguous(), k_pad)
        sb = sb.t()
    else:
        n_pad = round_up(b.fp8_data.shape[0], 16)
        db, sb = _pad_rows(b.fp8_data, n_pad), _pad_rows(b.fp8_scales, n_pad, 1.0).t().contiguous()
    sa = sa_rows.t().contiguous().t()
    out = torch._scaled_mm(da, db.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    return out[:m, :n]


def _probe_operand(rows: int, k: int, tile, device, gen) -> Quantized:
    """Random FP8 data with random power-of-two block scales, in the layout `pack` gives."""
    data = (torch.randn(rows, k, device=device, generator=gen) * 8).to(torch.float8_e4m3fn)
    grid = (rows // tile[0], k // tile[1])
    scales = torch.exp2(torch.randint(-4, 5, grid, device=device, generator=gen).float())
    return Quantized(None, None, data, scales, OperandSpec("fp8_e4m3", tile, scale_mode="pow2"))


def _dequantized(q: Quantized) -> torch.Tensor:
    return fp8.dequantize_blockwise(q.fp8_data, q.fp8_scales, q.spec.tile, torch.float32)


def _error_summary(error: Exception) -> str:
    """First and last line of torch's message: "Invalid scaling configuration." and the "Got ..." line
    with the shapes and strides it was given (the rules in between are the same every time)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
    return lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"


@functools.cache
def _blockwise_unsupported(device_index: int) -> str | None:
    """Why torch._scaled_mm cannot run blockwise FP8 on this GPU (None: both block pairings the layer
    uses ran on a small random GEMM and matched the product of the dequantized operands; K/128 = 3, so
    the 128x128 pairing goes through the K padding)."""
    device = torch.device("cuda", device_index)
    gen = torch.Generator(device=device).manual_seed(0)
    x = _probe_operand(256, 384, (1, 128), device, gen)
    w = _probe_operand(256, 384, (128, 128), device, gen)
    x2 = _probe_operand(128, 384, (1, 128), device, gen)

    def rel_err(out, ref):
        return float((out - ref).norm() / ref.norm())

    try:
        err = rel_err(_blockwise_gemm(x, x2), _dequantized(x) @ _dequantized(x2).t())  # Wgrad: 1x128 x 1x128
        if err > 1e-3:
            return (
                f"torch._scaled_mm's 1x128 x 1x128 blockwise GEMM differs from the dequantized product "
                f"(rel err {err:.2g})"
            )
        err = rel_err(_blockwise_gemm(x, w), _dequantized(x) @ _dequantized(w).t())  # Fprop / Dgrad: 1x128 x 128x128
        if err <= 1e-3:
            return None
        return (
            f"torch._scaled_mm's 1x128 x 128x128 blockwise GEMM differs from the dequantized product "
            f"(rel err {err:.2g})"
        )
    except (RuntimeError, TypeError) as error:
        return f"torch._scaled_mm refused blockwise FP8 scales here ({_error_summary(error)})"
