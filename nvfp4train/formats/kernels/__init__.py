"""Fused Triton quantizers: the same bits as the PyTorch reference functions, one read of the input.

One module per topic, each mirroring the reference it is tested against (tests/formats/test_triton.py):
``common`` (launch options, exact bf16 <-> FP32, rounding stores), ``amax`` (the global amax pass),
``rounding`` (rounding modes, Philox SR bits), ``e2m1`` (E2M1 rounding, the row-wise store tail),
``nvfp4``, ``mxfp4``, ``rht`` (the Wgrad operands: RHT + transpose + NVFP4 / MXFP4), ``fp8``, ``dequant``
(dequantizers and the emulated GEMM's epilogue), ``sm90`` (compiling a kernel for an H100 without one, for
the PTX / SASS checks). The comments name the reference line a step mirrors.

Importing this package imports ``triton``; callers pick it through ``formats/impl.py`` and import it only
where a kernel runs. CPU tensors run in Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is
first imported; see ``common``).
"""

from . import amax, common, dequant, e2m1, fp8, mxfp4, nvfp4, rht, rounding

__all__ = ["amax", "common", "dequant", "e2m1", "fp8", "mxfp4", "nvfp4", "rht", "rounding"]
