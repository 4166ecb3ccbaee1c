"""A BF16 GEMM whose output scale is a device scalar: cuBLAS's own epilogue applies it.

The emulated NVFP4 GEMM is (A · Bᵀ) × a × b: BF16 operands that are exact (E2M1 code × E4M3 block scale),
FP32 accumulation, and the operands' FP32 global decode scales a and b, which live on the GPU (they come
from each tensor's amax; reading them on the host would stall the step and break CUDA graphs). torch's
matmuls take a scale only as a host number, so the product went out in FP32 and a second pass multiplied
and rounded it (`backends.scale_and_cast`), a pass per GEMM (docs/results/code-measurements.md).
cuBLAS itself reads alpha from device memory in CUBLAS_POINTER_MODE_DEVICE: here `cublasGemmEx` is
called through ctypes on torch's own handle (its stream and workspace), alpha = a × b, beta = 0, the output
written once in its dtype (FP32 accumulator × alpha, rounded once to BF16 or kept in FP32).

Rounding: alpha × acc with alpha = fl(a × b) instead of fl(fl(acc × a) × b): at most an FP32 ulp apart before
the one rounding to the output dtype, which the emulation's GEMM tolerance (FP32 accumulation in any order)
already covers. Reduced-precision reductions are disallowed for the call, whatever torch's flag says.
Used by `backends.EmulatedBackend.gemm` on CUDA; `available()` is False (and the Triton epilogue runs)
where libcublas is not loaded into the process.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from nvfp4train.formats.impl import DISABLE_ENV

_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_16BF = 0, 14
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_CUBLAS_POINTER_MODE_HOST, _CUBLAS_POINTER_MODE_DEVICE = 0, 1
_CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
_DTYPES = {torch.bfloat16: _CUDA_R_16BF, torch.float32: _CUDA_R_32F}

_LIB: ctypes.CDLL | None = None
_LIB_ERROR: str | None = None
_CONSTANTS: dict[int, torch.Tensor] = {}


def _loaded_cublas_path() -> str | None:
    """The libcublas that torch loaded (so ctypes binds the same library, not a second copy)."""
    torch.cuda.current_blas_handle()  # makes torch load and initialise cuBLAS
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libcublas.so" in path:
                return path
    return None


def _lib() -> ctypes.CDLL | None:
    global _LIB, _LIB_ERROR
    if _LIB is None and _LIB_ERROR is None:
        try:
            path = _loaded_cublas_path()
            if path is None:
                raise OSError("no libcublas.so mapped into this process")
            lib = ctypes.CDLL(path)
            handle, i32, ptr = ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p
            # cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
            # computeType, algo)
            gemm_args = "h i i i i i p p i i p i i p p i i i i"
            lib.cublasGemmEx.argtypes = [{"h": handle, "i": i32, "p": ptr}[c] for c in gemm_args.split()]
            lib.cublasGemmEx.restype = i32
            for name in ("cublasSetPointerMode_v2", "cublasSetMathMode"):
                getattr(lib, name).argtypes, getattr(lib, name).restype = [handle, i32], i32
            for name in ("cublasGetPointerMode_v2", "cublasGetMathMode"):
                getattr(lib, name).argtypes, getattr(lib, name).restype = [handle, ctypes.POINTER(i32)], i32
            _LIB = lib
        except (OSError, AttributeError, RuntimeError) as e:
            _LIB_ERROR = f"{type(e).__name__}: {e}"
    return _LIB


@functools.cache  # asked at every emulated GEMM: answered once (a process keeps its GPUs and libraries)
def available() -> bool:
    return torch.cuda.is_available() and _lib() is not None


def _layout(t: torch.Tensor) -> tuple[bool, int] | None:
    """(row-major?, leading dimension) of a matrix cuBLAS can read in place; None if neither layout."""
    if t.stride(1) == 1 and t.stride(0) >= max(1, t.shape[1]):
        return True, t.stride(0)
    if t.stride(0) == 1 and t.stride(1) >= max(1, t.shape[0]):
        return False, t.stride(1)
    return None


def supports(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether `scaled_gemm` takes these operands: CUDA BF16 matrices, each row- or column-major; never with
    NVFP4TRAIN_TRITON=0, the switch that sends the emulated GEMM's epilogue (like our kernels) to PyTorch."""
    return (
        a.is_cuda
        and a.dtype == b.dtype == torch.bfloat16
        and a.dim() == b.dim() == 2
        and out_dtype in _DTYPES
        and a.shape[1] == b.shape[1]
        and available()
        and os.environ.get(DISABLE_ENV, "1") != "0"
        and _layout(a) is not None
        and _layout(b) is not None
        and not torch.compiler.is_compiling()
    )


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS {what} failed with status {status}")


def scaled_gemm(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(a [M, K] · b [N, K]ᵀ) × alpha in `out_dtype`: BF16 operands, FP32 accumulation, alpha a one-element FP32
    CUDA tensor read by cuBLAS on the device (None: 1), one rounding to out_dtype."""
    lib = _lib()
    out = torch.empty((a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        return out
    if a.shape[1] == 0:
        return out.zero_()
    constants = _CONSTANTS.get(a.device.index)
    if constants is None:  # [0, 1]: beta, and alpha when there is no scale (made by kernels: capturable)
        constants = torch.zeros(2, dtype=torch.float32, device=a.device)
        constants[1] = 1.0
        if not torch.cuda.is_current_stream_capturing():  # captured kernels run only when the graph does
            _CONSTANTS[a.device.index] = constants
    zero = constants[:1]
    alpha = constants[1:] if alpha is None else alpha.reshape(1).to(torch.float32).contiguous()
    if a.device.index == torch.cuda.current_device():
        _gemm_ex(lib, a, b, alpha, zero, out)
    else:
        with torch.cuda.device(a.device):  # the handle, stream and workspace of the operands' device
            _gemm_ex(lib, a, b, alpha, zero, out)
    return out


def _gemm_ex(
    lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, zero: torch.Tensor, out: torch.Tensor
) -> None:
    """out = alpha · (a · bᵀ) + 0 on the current device's handle, its pointer and math modes restored after."""
    (M, K), N = a.shape, b.shape[0]
    handle = ctypes.c_void_p(torch.cuda.current_blas_handle())  # bound to the current stream
    pointer_mode, math_mode = ctypes.c_int(), ctypes.c_int()
    _check(lib.cublasGetPointerMode_v2(handle, ctypes.byref(pointer_mode)), "get pointer mode")
    _check(lib.cublasGetMathMode(handle, ctypes.byref(math_mode)), "get math mode")
    _check(lib.cublasSetPointerMode_v2(handle, _CUBLAS_POINTER_MODE_DEVICE), "set pointer mode")
    try:
        _check(lib.cublasSetMathMode(handle, _CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), "set math mode")
        # Row-major out [M, N] is column-major outᵀ [N, M] = b [N, K] · aᵀ [K, M] in cuBLAS's column-major
        # terms: a row-major b is a column-major K x N matrix (so transposed), a row-major a is aᵀ already.
        (b_rows, ldb), (a_rows, lda) = _layout(b), _layout(a)
        _check(
            lib.cublasGemmEx(
                handle,
                _CUBLAS_OP_T if b_rows else _CUBLAS_OP_N,
                _CUBLAS_OP_N if a_rows else _CUBLAS_OP_T,
                N,
                M,
                K,
                alpha.data_ptr(),
                b.data_ptr(),
                _CUDA_R_16BF,
                ldb,
                a.data_ptr(),
                _CUDA_R_16BF,
                lda,
                zero.data_ptr(),
                out.data_ptr(),
                _DTYPES[out.dtype],
                N,
                _CUBLAS_COMPUTE_32F,
                _CUBLAS_GEMM_DEFAULT,
            ),
            "GemmEx",
        )
    finally:
        lib.cublasSetPointerMode_v2(handle, pointer_mode.value)
        lib.cublasSetMathMode(handle, math_mode.value)
