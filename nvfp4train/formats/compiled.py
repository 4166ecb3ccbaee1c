"""torch.compile twins of the quantizers for CUDA tensors: opt-in (``NVFP4TRAIN_COMPILE_QUANT=1``).

Each public quantizer (``nvfp4.quantize`` / ``fake_quantize``, ``mxfp4.quantize`` /
``fake_quantize``) checks its arguments and draws its stochastic-rounding bits eagerly, then runs
a pure tensor function — the "impl" — that fuses well: on CUDA that impl goes through
``torch.compile(dynamic=True)`` (one graph: no generator inside, so no graph break), elsewhere
it runs eagerly. Both run the same code on the same random bits, so they agree bit for bit
(``tests/formats/test_cuda.py`` checks it on a GPU).

* Off by default. ``NVFP4TRAIN_COMPILE_QUANT=1`` turns them on: 6-12x faster on an H200
  (``scripts/bench_quant.py``), but not yet bit-exact with eager: Triton lowers FP32 division and
  reciprocal to approximate instructions (``div.full``), and on an H200 the global decode scale came
  out 1 ulp off eager/TE. Eager CUDA is bit-exact with the CPU and TE's reference, so it stays the default.
* Inside an outer ``torch.compile`` the impl is called as is, and dynamo traces it there.
* If compiling fails (e.g. no Triton), a warning is logged once and eager is used from then on.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

ENV_VAR = "NVFP4TRAIN_COMPILE_QUANT"
log = logging.getLogger(__name__)
_broken = False  # set when a compile attempt failed: eager from then on


def enabled_for(x: torch.Tensor) -> bool:
    """Whether quantizing ``x`` goes through the compiled twin."""
    return (
        x.is_cuda
        and not _broken
        and os.environ.get(ENV_VAR, "0") == "1"
        and not torch.compiler.is_compiling()
    )


@functools.cache
def compiled(impl):
    """The compiled twin of ``impl`` (compiled lazily on first call, cached per impl)."""
    return torch.compile(impl, dynamic=True)


def run(impl, x: torch.Tensor, *args):
    """``impl(x, *args)``, through its compiled twin when ``enabled_for(x)``."""
    global _broken
    if not enabled_for(x):
        return impl(x, *args)
    try:
        return compiled(impl)(x, *args)
    except Exception as error:  # noqa: BLE001 - any compile failure falls back to eager
        _broken = True
        log.warning("%s: torch.compile of %s failed (%s); using eager from now on (set %s=0 to skip)",
                    __name__, impl.__qualname__, error, ENV_VAR)
        return impl(x, *args)
