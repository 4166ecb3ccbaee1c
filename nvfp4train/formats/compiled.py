"""torch.compile twins of the quantizers, used automatically for CUDA tensors.

Each public quantizer (``nvfp4.quantize`` / ``fake_quantize``, ``mxfp4.quantize`` /
``fake_quantize``) checks its arguments and draws its stochastic-rounding bits eagerly, then runs
a pure tensor function — the "impl" — that fuses well: on CUDA that impl goes through
``torch.compile(dynamic=True)`` (one graph: no generator inside, so no graph break), elsewhere
it runs eagerly. Both run the same code on the same random bits, so they agree bit for bit
(``tests/formats/test_cuda.py`` checks it on a GPU).

* ``NVFP4TRAIN_COMPILE_QUANT=0`` in the environment turns the twins off (eager everywhere).
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
        and os.environ.get(ENV_VAR, "1") != "0"
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
