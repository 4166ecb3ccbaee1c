"""mamba-ssm's and causal-conv1d's kernels: the one module of ours that imports either package.

Both are optional (a CUDA build each; neither is on a CPU machine), so every import happens on first use and
fails as ImportError (or, for causal-conv1d, as "not available"). What the rest of the model reads from them:

- mamba-ssm's Triton modules (`import_mamba_triton`), imported without the package's `__init__`;
- its SSD scan: `load_triton_ssd` (`mamba_chunk_scan_combined`, its own autograd.Function) and the forward and
  backward it runs (`chunk_scan_forward`, `chunk_scan_backward`), which our custom ops call (ssd.py, mixer_op.py);
- its gated RMSNorm module (`gated_norm_kernels`: `layernorm_gated`, whose kernels fused_norm.py launches);
- its deterministic mode: `match_triton_determinism` pins the SSD's autotuned kernels to one configuration while
  torch's deterministic mode is on, and `backward_cumsums_allowed` lets the SSD backward's cumsums through it;
- causal-conv1d's CUDA kernel (`causal_conv1d_kernel_available`, `causal_conv1d_extension`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable

import torch

from ..marks import assume_constant_result

_TRITON_SSD: Callable | None = None
_TRITON_SSD_ERROR: str | None = None


def import_mamba_triton(submodule: str):
    """Import one of mamba-ssm's Triton modules (`mamba_ssm.ops.triton.<submodule>`) without importing
    the mamba_ssm package.

    `import mamba_ssm` runs its __init__, which needs the compiled `selective_scan_cuda`
    extension; the pure-Python wheel (MAMBA_SKIP_CUDA_BUILD) has only the Triton kernels.
    Registering a bare package object under the name `mamba_ssm` lets the Triton submodules
    import (README.md, GPU install: mamba-ssm's Triton-only build). Raises ImportError when unavailable.
    """
    try:
        if "mamba_ssm" not in sys.modules:
            spec = importlib.util.find_spec("mamba_ssm")
            if spec is None or spec.submodule_search_locations is None:
                raise ImportError("mamba-ssm is not installed")
            package = types.ModuleType("mamba_ssm")
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules["mamba_ssm"] = package
        return importlib.import_module(f"mamba_ssm.ops.triton.{submodule}")
    except Exception as e:  # ImportError, or triton failing to initialise without a GPU
        raise ImportError(
            f"mamba-ssm Triton {submodule} unavailable ({type(e).__name__}: {e}); it needs triton (CUDA) and "
            "mamba-ssm's pure wheel: MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip wheel "
            "--no-deps --no-build-isolation mamba-ssm==2.3.2.post1, installed with --no-deps"
        ) from e


def load_triton_ssd() -> Callable:
    """mamba-ssm's `mamba_chunk_scan_combined` (its own autograd.Function); raises ImportError when unavailable."""
    global _TRITON_SSD, _TRITON_SSD_ERROR
    if _TRITON_SSD is not None:
        return _TRITON_SSD
    if _TRITON_SSD_ERROR is not None:
        raise ImportError(_TRITON_SSD_ERROR)
    try:
        _TRITON_SSD = import_mamba_triton("ssd_combined").mamba_chunk_scan_combined
    except ImportError as e:
        _TRITON_SSD_ERROR = str(e)
        raise
    return _TRITON_SSD


def chunk_scan_forward(*args, **kwargs):
    """mamba-ssm's `_mamba_chunk_scan_combined_fwd` (what `mamba_chunk_scan_combined` runs forward), with its
    arguments; its module must be imported already (`load_triton_ssd`)."""
    return sys.modules["mamba_ssm.ops.triton.ssd_combined"]._mamba_chunk_scan_combined_fwd(*args, **kwargs)


def chunk_scan_backward(*args, **kwargs):
    """mamba-ssm's `_mamba_chunk_scan_combined_bwd` (what `mamba_chunk_scan_combined` runs backward), with its
    arguments (including the gradient buffers it writes into: dx, ddt, dB, dC)."""
    return sys.modules["mamba_ssm.ops.triton.ssd_combined"]._mamba_chunk_scan_combined_bwd(*args, **kwargs)


_GATED_NORM = None


def gated_norm_kernels():
    """mamba-ssm's `layernorm_gated` module (RMSNorm and gated RMSNorm kernels; fused_norm.py launches them);
    raises ImportError when unavailable."""
    global _GATED_NORM
    if _GATED_NORM is None:
        _GATED_NORM = import_mamba_triton("layernorm_gated")
    return _GATED_NORM


# mamba-ssm's modules whose kernels `mamba_chunk_scan_combined` runs (all of them autotuned by timing)
SSD_TRITON_MODULES = ("ssd_bmm", "ssd_chunk_state", "ssd_state_passing", "ssd_chunk_scan", "ssd_combined")
_PINNED: dict = {}  # Autotuner -> its own list of configs, while pinned


def _config_cost(config) -> int:
    """A configuration's size: the product of its block sizes times its pipeline stages (the smallest is
    the one mamba-ssm's deterministic mode keeps when it decides at import)."""
    size = 1
    for key, value in config.kwargs.items():
        if key.startswith("BLOCK_SIZE_"):
            size *= value
    return size * (config.num_stages or 1)


def pin_triton_configs(modules, pinned: bool) -> int:
    """Pin every Triton autotuner in `modules` to one configuration (the smallest, the first of equals: the
    same in every process), or give each back its own list. Returns how many autotuners changed.

    mamba-ssm decides between autotuning and one configuration when its modules are imported (with
    TRITON_CACHE_AUTOTUNING=1, which the trainer sets (train/build.py), it keeps autotuning even in its deterministic
    mode, and two fresh processes can time their way to different block sizes). Pinning here holds whatever
    was imported first, and a choice cached from an earlier call is dropped."""
    from triton.runtime.autotuner import Autotuner

    changed = 0
    for module in modules:
        for kernel in vars(module).values():
            if not isinstance(kernel, Autotuner):
                continue
            if pinned and kernel not in _PINNED and len(kernel.configs) > 1:
                _PINNED[kernel] = kernel.configs
                kernel.configs = [min(kernel.configs, key=_config_cost)]
            elif not pinned and kernel in _PINNED:
                kernel.configs = _PINNED.pop(kernel)
            else:
                continue
            kernel.cache.clear()
            changed += 1
    return changed


_PINNED_STATE: bool | None = None


def match_triton_determinism() -> None:
    """Pin mamba-ssm's SSD kernels while torch's deterministic mode is on, unpin them when it is off (runs
    inside the custom ops of ssd.py and mixer_op.py, so eagerly at every call: a comparison once the state
    matches)."""
    global _PINNED_STATE
    wanted = torch.are_deterministic_algorithms_enabled()
    if _PINNED_STATE is not wanted:
        pin_triton_configs([import_mamba_triton(name) for name in SSD_TRITON_MODULES], wanted)
        switch = sys.modules.get("mamba_ssm.utils.determinism")
        if switch is not None:  # its own flag, whatever MAMBA_DETERMINISTIC says; None: follow torch's again
            switch.set_deterministic_mode(True if wanted else None)
        _PINNED_STATE = wanted


@contextlib.contextmanager
def backward_cumsums_allowed():
    """mamba-ssm's SSD backward calls torch.cumsum on CUDA tensors (over each chunk's positions), and torch's
    deterministic mode refuses every floating-point CUDA cumsum (it has no kernel it vouches for). Along the
    innermost dimension of a tensor of many rows, as here, torch scans each row in a fixed order, and the GPU
    check (scripts/check_determinism_gpu.py) repeats the whole backward bit for bit. For the length of that
    call only, deterministic mode is warn-only and that one warning is silenced; any other op it would flag
    still warns."""
    if not torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled():
        yield
        return
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="cumsum_cuda_kernel does not have a deterministic")
            yield
    finally:
        torch.use_deterministic_algorithms(True)


@functools.cache
def triton_ssd_deterministic_mode() -> bool:
    """Whether the installed mamba-ssm has a deterministic mode (2.3+: `mamba_ssm.utils.determinism`,
    which follows torch.are_deterministic_algorithms_enabled())."""
    try:
        load_triton_ssd()  # its modules import mamba_ssm.utils.determinism where there is one
    except ImportError:
        return False
    return "mamba_ssm.utils.determinism" in sys.modules


@assume_constant_result  # evaluated once when compiling, not traced
def triton_ssd_available() -> bool:
    try:
        load_triton_ssd()
        return True
    except ImportError:
        return False


# ---- causal-conv1d ----------------------------------------------------------------------------------------

_CAUSAL_CONV1D: Callable | None = None
_CAUSAL_CONV1D_TRIED = False


def _load_causal_conv1d() -> Callable | None:
    global _CAUSAL_CONV1D, _CAUSAL_CONV1D_TRIED
    if not _CAUSAL_CONV1D_TRIED:
        _CAUSAL_CONV1D_TRIED = True
        try:
            from causal_conv1d import causal_conv1d_fn  # compiled CUDA extension, optional

            _CAUSAL_CONV1D = causal_conv1d_fn
        except Exception:
            _CAUSAL_CONV1D = None
    return _CAUSAL_CONV1D


@assume_constant_result
def causal_conv1d_kernel_available() -> bool:
    return _load_causal_conv1d() is not None


def _causal_conv1d_extension(x, weight, bias):
    """causal-conv1d's `causal_conv1d_fn` with SiLU: x [b, channels, T], weight [channels, 1, k]."""
    return _load_causal_conv1d()(x, weight.squeeze(1), bias, activation="silu")


def __getattr__(name: str):
    # `causal_conv1d_extension`: the compiled CUDA extension, which compiled code runs eagerly. It is made on first
    # use: torch.compiler.disable imports torch._dynamo, which a model that never calls it does not need.
    if name == "causal_conv1d_extension":
        extension = torch.compiler.disable(_causal_conv1d_extension)
        globals()[name] = extension
        return extension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
