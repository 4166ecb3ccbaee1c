"""The external Mamba kernels (mamba-ssm, causal-conv1d) behind the names the model uses: `mamba_kernels.py`
is the one module of ours that imports either package, each on first use."""

from .mamba_kernels import (
    SSD_TRITON_MODULES,
    backward_cumsums_allowed,
    causal_conv1d_kernel_available,
    chunk_scan_backward,
    chunk_scan_forward,
    gated_norm_kernels,
    import_mamba_triton,
    load_triton_ssd,
    match_triton_determinism,
    pin_triton_configs,
    triton_ssd_available,
    triton_ssd_deterministic_mode,
)

__all__ = [
    "SSD_TRITON_MODULES",
    "backward_cumsums_allowed",
    "causal_conv1d_extension",
    "causal_conv1d_kernel_available",
    "chunk_scan_backward",
    "chunk_scan_forward",
    "gated_norm_kernels",
    "import_mamba_triton",
    "load_triton_ssd",
    "match_triton_determinism",
    "pin_triton_configs",
    "triton_ssd_available",
    "triton_ssd_deterministic_mode",
]


def __getattr__(name: str):
    if name == "causal_conv1d_extension":  # made on first use: mamba_kernels.py
        from . import mamba_kernels

        return mamba_kernels.causal_conv1d_extension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
