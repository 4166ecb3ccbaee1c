"""Pure numerics: NVFP4, MXFP4 and FP8 quantizers, the random Hadamard transform, E2M1 rounding.

Functions of tensors only (CPU or CUDA); nothing here imports the rest of nvfp4train.

    from nvfp4train.formats import nvfp4, mxfp4, fp8, hadamard
    q = nvfp4.quantize(x, tile=(1, 16), rounding="rne")      # packed, bit-exact with TE
    v, s_dec = nvfp4.fake_quantize(x, tile=(16, 16))           # dense e2m1*scale_b, + global scale
    y = hadamard.rht(x, d=16)

The quantizers take ``impl="auto" | "reference" | "triton"`` (impl.py): fused Triton kernels
(kernels/, imported only when used) on CUDA, the PyTorch reference elsewhere.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import activation, e2m1, fp8, hadamard, impl, mxfp4, nvfp4, rounding
    from .rounding import sr_generator

_SUBMODULES = ("activation", "e2m1", "fp8", "hadamard", "impl", "mxfp4", "nvfp4", "rounding")


def __getattr__(name: str):
    # the modules (and torch) load on first use: `formats.scale_rules`, which the precision config reads, does not
    # need them
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "sr_generator":
        return importlib.import_module(f"{__name__}.rounding").sr_generator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["activation", "e2m1", "fp8", "hadamard", "impl", "mxfp4", "nvfp4", "rounding", "sr_generator"]
