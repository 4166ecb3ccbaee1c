"""Which implementation a quantizer runs: ``impl="auto" | "reference" | "triton"``.

* "reference": the PyTorch functions in nvfp4.py / mxfp4.py (any device; bit-exact with TE's
  reference quantizer, golden vectors in tests/formats/golden/).
* "triton": the fused kernels in kernels/ (the same bits; SR draws Philox bits from a
  seed taken from ``generator``, so its bits differ from the reference's for a given generator,
  with the same distribution). CUDA tensors, or CPU tensors in Triton's interpreter
  (``TRITON_INTERPRET=1`` set before triton is imported).
* "auto": "triton" for CUDA tensors when triton is installed (and NVFP4TRAIN_TRITON is not 0),
  "reference" otherwise, and also while
  torch.compile traces (dynamo traces the reference's tensor ops; the kernels' wrappers are not
  written for tracing).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

IMPLS = ("auto", "reference", "triton")


DISABLE_ENV = "NVFP4TRAIN_TRITON"  # =0: none of our Triton kernels runs ("auto" picks the PyTorch code)


def triton_available() -> bool:
    """Whether our Triton kernels may run: the triton package is installed (not imported here: it is
    imported on first use) and NVFP4TRAIN_TRITON is not 0, the switch that sends every "auto" (the
    quantizers, the emulated GEMM's epilogue, the Mamba conv) to the PyTorch code, e.g. to rule the
    kernels out when a GPU result looks wrong (precision/backends/cublas.py reads it too)."""
    return os.environ.get(DISABLE_ENV, "1") != "0" and _triton_installed()


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor, impl: str, who: str) -> bool:
    """Whether ``who`` (e.g. "nvfp4.quantize") runs the Triton kernel for ``x``; ValueError in one
    line for an unknown ``impl`` or a "triton" request that cannot run here."""
    if impl not in IMPLS:
        raise ValueError(f"{who}: impl={impl!r} is not supported; allowed: {IMPLS}")
    if impl == "reference":
        return False
    if impl == "auto":
        return x.is_cuda and triton_available() and not torch.compiler.is_compiling()
    if not _triton_installed():  # an explicit request runs even with NVFP4TRAIN_TRITON=0
        raise ValueError(f"{who}: impl='triton' needs the triton package (pip install triton); use impl='reference'")
    if not x.is_cuda:
        from . import kernels

        if not kernels.common.INTERPRETED:
            raise ValueError(
                f"{who}: impl='triton' on a {x.device.type} tensor runs in Triton's interpreter, which needs "
                "TRITON_INTERPRET=1 in the environment before triton is imported "
                f"(now {os.environ.get('TRITON_INTERPRET')!r}); use impl='reference' or a CUDA tensor"
            )
    return True
