"""Model FLOPs utilization against the detected GPU's dense peak for a given precision.

Peaks are per GPU, dense (no 2:4 sparsity), from NVIDIA's datasheets. "fp4" exists only on
Blackwell; Hopper and Ampere have no FP4 tensor cores, so emulated NVFP4 on an H100 is best
judged against the "bf16" peak (the GEMMs actually run in BF16) — we never invent a peak.
On CPU, or a GPU not in the table, `peak_flops` returns None and MFU is not reported.
"""

from __future__ import annotations

import torch

T = 1e12
# (substring of torch.cuda.get_device_name, label, {precision: dense FLOP/s}); first match wins,
# so more specific names come first.
PEAK_TABLE: list[tuple[str, str, dict[str, float]]] = [
    ("GH200", "GH200", {"bf16": 989.4 * T, "fp8": 1978.9 * T}),  # before "H200", which it contains
    ("GB300", "GB300", {"bf16": 2500 * T, "fp8": 5000 * T, "fp4": 15000 * T}),
    ("GB200", "GB200", {"bf16": 2500 * T, "fp8": 5000 * T, "fp4": 10000 * T}),
    ("B200", "B200 SXM", {"bf16": 2250 * T, "fp8": 4500 * T, "fp4": 9000 * T}),
    ("H200 NVL", "H200 NVL", {"bf16": 835.5 * T, "fp8": 1671 * T}),
    ("H200", "H200 SXM", {"bf16": 989.4 * T, "fp8": 1978.9 * T}),
    ("H100 NVL", "H100 NVL", {"bf16": 835.5 * T, "fp8": 1671 * T}),
    ("H100 PCIe", "H100 PCIe", {"bf16": 756 * T, "fp8": 1513 * T}),
    ("H100", "H100 SXM", {"bf16": 989.4 * T, "fp8": 1978.9 * T}),  # "H100 80GB HBM3" is SXM
    ("H20", "H20", {"bf16": 148 * T, "fp8": 296 * T}),  # after every "H200" row (substring)
    ("L40S", "L40S", {"bf16": 362.05 * T, "fp8": 733 * T}),
    ("A100", "A100", {"bf16": 312 * T}),
    ("A800", "A800", {"bf16": 312 * T}),
]
PRECISIONS = ("bf16", "fp8", "fp4")


def lookup_peak(device_name: str, precision: str) -> tuple[float, str] | None:
    """(dense FLOP/s, label) for a device name as torch reports it, or None if unknown."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    for key, label, peaks in PEAK_TABLE:
        if key in device_name:
            if precision not in peaks:
                return None  # this GPU has no tensor cores for that format
            return peaks[precision], f"{label} dense {precision.upper()} {peaks[precision] / T:g} TFLOP/s"
    return None


def peak_flops(device: torch.device | str | int | None = None, precision: str = "bf16") -> tuple[float, str] | None:
    """Peak dense FLOP/s of `device` for `precision` ("bf16" | "fp8" | "fp4"), with a label
    naming the GPU and the peak; None on CPU, without CUDA, or for a GPU not in the table."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if device is not None and torch.device(device).type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    return lookup_peak(torch.cuda.get_device_name(device), precision)


def mfu(
    flops_per_token: float,
    tokens_per_second: float,
    n_gpus: int = 1,
    device: torch.device | str | int | None = None,
    precision: str = "bf16",
) -> tuple[float, str] | None:
    """(model FLOPs utilization in [0, 1], label of the peak used), or None when the peak is unknown.
    `tokens_per_second` is the global throughput over `n_gpus` identical GPUs."""
    peak = peak_flops(device, precision)
    if peak is None:
        return None
    flops, label = peak
    return flops_per_token * tokens_per_second / (n_gpus * flops), label
