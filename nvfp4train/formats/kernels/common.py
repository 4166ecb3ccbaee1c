"""What every quantizer kernel shares: launch options, a tile's offsets, exact bf16 <-> FP32 conversions, the
stores that round as torch's ``.to(dtype)``, the sign-bit negation, the E2M1 quantizers' output tensors.

Rules that keep the kernels' bits identical to the PyTorch references on a GPU:

* every division is ``tl.div_rn`` (Triton lowers ``/`` on FP32 to an approximate division);
* kernels are launched with ``enable_fp_fusion=False``, so no multiply and add fuse into an FMA
  (the reference rounds each product);
* the casts to E4M3 and E2M1 are integer bit arithmetic (round to nearest even, NaN -> 0x7F), not
  Triton's float8 conversion, whose saturation and NaN rules differ across backends;
* maxima are taken over the integer bits of |x|: for non-negative floats integer order is float
  order, and a NaN's bits exceed +Inf's, so a NaN anywhere gives a NaN amax, as ``torch.amax``.

CPU tensors run in Triton's interpreter, which needs ``TRITON_INTERPRET=1`` in the environment
before ``triton`` is first imported (``@triton.jit`` decides at import time, also for
``triton.language``'s own functions).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton import knobs

# Whether this module's kernels were decorated for the interpreter (CPU tensors) or for the GPU.
INTERPRETED = bool(knobs.runtime.interpret)

# Globals a kernel reads must be tl.constexpr (Triton refuses other globals when compiling).
FLT_MAX = tl.constexpr(3.4028234663852886e38)

# Tile of one program of the row-wise quantizers: 16 rows (a 16x16 tile's height) x 256 columns (16 scale
# blocks).
BLOCK_ROWS, BLOCK_COLS = 16, 256


def launch_options(x: torch.Tensor) -> dict:
    # The interpreter takes no compile options.
    return {} if not x.is_cuda else {"enable_fp_fusion": False, "num_warps": 4}


def e2m1_outputs(shape, group: int, dense: bool, dtype: torch.dtype, device, unused: torch.Tensor | None = None):
    """(codes, scales, values): the outputs of an NVFP4 / MXFP4 quantizer of a tensor of ``shape`` with blocks of
    ``group`` along its last dimension. dense: values in ``dtype`` of ``shape``; else packed E2M1 codes (uint8, two a
    byte) and scale bits (uint8, one a block). The kernels take all three pointers and write one kind; ``unused``
    (default: a tensor of the kind written) stands for the others."""
    *lead, cols = shape
    if dense:
        values = torch.empty(shape, dtype=dtype, device=device)
        other = values if unused is None else unused
        return other, other, values
    codes = torch.empty((*lead, cols // 2), dtype=torch.uint8, device=device)
    scales = torch.empty((*lead, cols // group), dtype=torch.uint8, device=device)
    return codes, scales, codes if unused is None else unused


@triton.jit
def tile_offsets(r0, c0, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Rows r0 .. r0 + BLOCK_R, columns c0 .. c0 + BLOCK_C of a row-major [rows, cols] tensor: (the rows, the
    columns, the mask of the elements inside the tensor, their int64 offsets)."""
    r = r0 + tl.arange(0, BLOCK_R)
    c = c0 + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    offs = r[:, None].to(tl.int64) * cols + c[None, :]
    return r, c, mask, offs


# bf16 <-> FP32 by bit arithmetic: Triton's interpreter converts bf16 with its own float code,
# which truncates FP32 -> bf16 (its "rtne" mode does not carry either) and mangles subnormals both
# ways; the GPU converts correctly. The bit forms below give both the same bits.
@triton.jit
def to_fp32(x):
    """A loaded tensor (bf16, fp16 or fp32) widened to FP32 exactly."""
    if x.dtype == tl.bfloat16:
        return ((x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _bf16_rne_bits(v):
    """FP32 v rounded to bf16 to nearest even (NaN stays NaN, overflow gives Inf), as the FP32 word
    with its low 16 bits clear."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536 = 0xFFFF0000
    nan_bits = v.to(tl.int32, bitcast=True) | 0x400000  # a NaN's payload could carry out: keep it, quiet
    return tl.where(v != v, nan_bits & -65536, bits)


@triton.jit
def round_to(v, DTYPE: tl.constexpr, HW_BF16: tl.constexpr = False):
    """FP32 v rounded to DTYPE and widened back to FP32 (torch's ``.to(dtype).float()``). HW_BF16
    (CUDA sm_80+, ``hw_bf16``): bf16 by the GPU's own round-to-nearest-even conversion, 2 instructions
    where the bit arithmetic takes 8; the same values, a NaN coming back as the canonical NaN instead of
    with its payload (every consumer treats NaN alike)."""
    if DTYPE == tl.bfloat16:
        if HW_BF16:
            return v.to(tl.bfloat16).to(tl.float32)
        return _bf16_rne_bits(v).to(tl.float32, bitcast=True)
    else:
        return v.to(DTYPE).to(tl.float32)


def hw_bf16(x: torch.Tensor) -> bool:
    """Whether kernels round FP32 to bf16 with the GPU's conversion (CUDA sm_80+: cvt.rn.bf16.f32; never in
    the interpreter, whose bf16 conversion truncates)."""
    return x.is_cuda and _sm80_or_newer(x.get_device())


@functools.cache
def _sm80_or_newer(device_index: int) -> bool:  # asked at every launch: the device query once per GPU
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


# A quantizer's prologue (formats/activation.py): what it applies to each element as it loads it.
PROLOGUE_CODES = {None: 0, "squared_relu": 1, "squared_relu_grad": 2}


@triton.jit
def apply_prologue(x, a, PROLOGUE: tl.constexpr, HW_BF16: tl.constexpr):
    """activation.apply on a loaded bf16 tile: x itself (PROLOGUE 0), squared_relu(x) (1), or squared_relu_grad(x,
    a) (2, a the activation's input tile), computed in FP32 (products of two bf16 values are exact) and rounded to
    bf16 once, as the reference rounds it. HW_BF16: the GPU's conversion (`round_to`)."""
    if PROLOGUE == 0:
        y = x
    else:
        v = to_fp32(x)
        if PROLOGUE == 1:
            r = tl.where(v <= 0, 0.0, v)  # relu; a NaN stays NaN
            v = r * r
        else:
            av = to_fp32(a)
            v = tl.where(av <= 0, 0.0, v * (av * 2.0))
        if HW_BF16:
            y = v.to(tl.bfloat16)
        else:
            y = (_bf16_rne_bits(v) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return y


@triton.jit
def store_as(ptr, offs, v, mask):
    """Store FP32 v into ``ptr``'s dtype, rounding to nearest even as torch's ``.to(dtype)``."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = (_bf16_rne_bits(v) >> 16).to(tl.int16)
        tl.store(ptr.to(tl.pointer_type(tl.int16)) + offs, bits, mask=mask)
    else:
        tl.store(ptr + offs, v.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_exact(ptr, offs, v, mask):
    """store_as for FP32 v that ptr's dtype holds exactly or that overflows FP32 too (E2M1 values times
    an E4M3 or E8M0 block scale: at most 6 significant bits, within bf16's exponent range): a bf16
    store keeps the word's high half, the rounding store_as would do changing nothing (NaN too: an
    arithmetic NaN is quiet already)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
        tl.store(ptr.to(tl.pointer_type(tl.int16)) + offs, bits, mask=mask)
    else:
        store_as(ptr, offs, v, mask)


@triton.jit
def abs_max_bits(v):
    """max |v| over all of FP32 v, as the int32 bits of the magnitude (a NaN's above +Inf's: the maximum
    of ``bits & 0x7FFFFFFF``) without masking every element: as signed integers the largest word is the
    largest non-negative value's (a positive NaN's above +Inf's), as unsigned integers the largest is the
    largest-magnitude negative value's (a negative NaN's above -Inf's) when there is one, else the same
    non-negative word. The larger of the two magnitudes is max |v|: two integer maxima a pair of elements
    (3-input max instructions), no AND an element."""
    bits = tl.reshape(v, (v.numel,)).to(tl.int32, bitcast=True)
    non_negative = tl.max(bits, axis=0)
    negative = tl.max(bits.to(tl.uint32, bitcast=True), axis=0).to(tl.int32, bitcast=True)
    return tl.maximum(non_negative & 0x7FFFFFFF, negative & 0x7FFFFFFF)


@triton.jit
def with_sign(magnitude, negative):
    """-magnitude where negative, by the sign bit: Triton's unary minus is 0 - x, which would turn
    the reference's -0.0 (a negative value rounded to zero) into +0.0."""
    bits = magnitude.to(tl.int32, bitcast=True) | (negative.to(tl.int32) << 31)
    return bits.to(tl.float32, bitcast=True)

