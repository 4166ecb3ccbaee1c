"""Dequantizers (NVFP4 / MXFP4 codes x block scales, FP8 blockwise) and the emulated GEMM's epilogue: one
read of the stored form, one write of the values."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import launch_options, store_as, store_exact, tile_offsets, with_sign
from .e2m1 import e2m1_magnitude
from .fp8 import fp8_value


@triton.jit
def _fp8_dequantize_blockwise_kernel(data_ptr, scales_ptr, values_ptr, rows, cols, TILE_R: tl.constexpr,
                                     MANT: tl.constexpr, BIAS: tl.constexpr, BLOCK_R: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
    """fp8.dequantize_blockwise: FP8 bits x their TILE_R x 128 block's FP32 decode scale (FP32 product),
    rounded to the output's dtype; one read of the codes, one write of the values."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    r, c, mask, offs = tile_offsets(pid_r * BLOCK_R, pid_c * BLOCK_C, rows, cols, BLOCK_R, BLOCK_C)
    code = tl.load(data_ptr + offs, mask=mask, other=0).to(tl.int32)
    scale_offs = (r // TILE_R)[:, None].to(tl.int64) * (cols // 128) + (c // 128)[None, :]
    scale = tl.load(scales_ptr + scale_offs, mask=mask, other=1.0)
    store_as(values_ptr, offs, fp8_value(code, MANT, BIAS) * scale, mask)


def fp8_blockwise(data: torch.Tensor, scales: torch.Tensor, block, dtype: torch.dtype) -> torch.Tensor:
    """fp8.dequantize_blockwise (arguments checked by the caller): values in ``dtype``, data's shape."""
    data = data.contiguous()
    cols = data.shape[-1]
    rows = data.numel() // cols
    mant, bias = (3, 7) if data.dtype == torch.float8_e4m3fn else (2, 15)
    values = torch.empty(data.shape, dtype=dtype, device=data.device)
    block_r, block_c = 8, 256
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _fp8_dequantize_blockwise_kernel[grid](
        data.view(torch.uint8), scales.contiguous(), values, rows, cols, TILE_R=block[0], MANT=mant, BIAS=bias,
        BLOCK_R=block_r, BLOCK_C=block_c, **launch_options(data),
    )
    return values


# ------------------------------------------------------------------------------ emulated GEMM epilogue
SCALE_CAST_BLOCK = 4096


@triton.jit
def _scale_and_cast_kernel(x_ptr, a_ptr, b_ptr, y_ptr, n, HAS_A: tl.constexpr, HAS_B: tl.constexpr,
                           BLOCK: tl.constexpr):
    """y = ((x * a) * b) in y's dtype, each product rounded in FP32 and the cast to nearest even, as
    eager's `out * a * b` then `.to(dtype)`: one read of the FP32 GEMM output, one write."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_A:
        v = v * tl.load(a_ptr)
    if HAS_B:
        v = v * tl.load(b_ptr)
    store_as(y_ptr, offs, v, mask)


def scale_and_cast(x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None, dtype: torch.dtype):
    """((x * a) * b).to(dtype) of a contiguous FP32 x with 0-d FP32 a, b (None: no factor), in one pass."""
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    n = x.numel()
    _scale_and_cast_kernel[(triton.cdiv(n, SCALE_CAST_BLOCK),)](
        x, x if a is None else a, x if b is None else b, y, n, HAS_A=a is not None, HAS_B=b is not None,
        BLOCK=SCALE_CAST_BLOCK, **launch_options(x),
    )
    return y


# ------------------------------------------------------------------------------ NVFP4 / MXFP4 dequantize
@triton.jit
def _e2m1_dequantize_kernel(codes_ptr, scales_ptr, global_ptr, values_ptr, rows, cols, GROUP: tl.constexpr,
                            E8M0: tl.constexpr, HAS_GLOBAL: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_C: tl.constexpr):
    """NVFP4Tensor / MXFP4Tensor.dequantize: e2m1(code) x its GROUP-element block scale (E4M3, or E8M0
    when E8M0), exact in FP32, times the global decode scale when HAS_GLOBAL (FP32-rounded), rounded to
    the output's dtype; one read of the packed codes and scales, one write. The columns (``cols``, even,
    a multiple of GROUP) split into BLOCK_C-wide tiles, BLOCK_C a multiple of GROUP."""
    NB: tl.constexpr = BLOCK_C // GROUP
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row = r[:, None].to(tl.int64)
    row_ok = r[:, None] < rows
    # Each code byte once (element 2j in the low nibble, 2j + 1 in the high one), each block scale once,
    # both spread over their elements in registers.
    c2 = tl.program_id(1) * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
    byte = tl.load(codes_ptr + row * (cols // 2) + c2[None, :], mask=row_ok & (c2[None, :] < cols // 2),
                   other=0).to(tl.int32)
    code = tl.reshape(tl.join(byte & 0xF, (byte >> 4) & 0xF), (BLOCK_R, BLOCK_C))
    value = with_sign(e2m1_magnitude(code & 0x7), (code & 0x8) != 0)  # code 0x8 is -0.0 (0 - x would give +0.0)
    cb = tl.program_id(1) * NB + tl.arange(0, NB)
    bits = tl.load(scales_ptr + row * (cols // GROUP) + cb[None, :], mask=row_ok & (cb[None, :] < cols // GROUP),
                   other=0).to(tl.int32)
    if E8M0:
        scale = (tl.maximum(bits, 1) << 23).to(tl.float32, bitcast=True)  # 2^(bits - 127)
        scale = tl.where(bits == 0, 2.0**-127, scale)
        scale = tl.where(bits == 255, float("nan"), scale)
    else:
        scale = fp8_value(bits, 3, 7)  # E4M3
    out = tl.reshape(tl.reshape(value, (BLOCK_R, NB, GROUP)) * scale[:, :, None], (BLOCK_R, BLOCK_C))
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = row_ok & (c[None, :] < cols)
    if HAS_GLOBAL:
        store_as(values_ptr, row * cols + c[None, :], out * tl.load(global_ptr), mask)
    else:  # code x block scale: exact in the output's dtype
        store_exact(values_ptr, row * cols + c[None, :], out, mask)


def e2m1(codes: torch.Tensor, scales: torch.Tensor, global_decode_scale: torch.Tensor | None,
                    shape, group: int, e8m0: bool, dtype: torch.dtype) -> torch.Tensor:
    """Values in ``dtype`` of logical ``shape`` from packed E2M1 codes and per-``group`` scales (E4M3 for
    NVFP4, E8M0 for MXFP4), times ``global_decode_scale`` when given."""
    cols = shape[-1]
    rows = codes.numel() * 2 // cols
    values = torch.empty(shape, dtype=dtype, device=codes.device)
    block_r, block_c = 8, 256
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _e2m1_dequantize_kernel[grid](
        codes.contiguous(), scales.contiguous().view(torch.uint8),
        values if global_decode_scale is None else global_decode_scale, values, rows, cols,
        GROUP=group, E8M0=e8m0, HAS_GLOBAL=global_decode_scale is not None, BLOCK_R=block_r, BLOCK_C=block_c,
        **launch_options(codes),
    )
    return values


