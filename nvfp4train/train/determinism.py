"""`train.deterministic=true`: the same config and seed give bitwise-equal runs on one GPU model.

What it switches on, for the duration of a run (and restores afterwards, so that runs in one process do
not leak into each other):
- torch's deterministic mode (`torch.use_deterministic_algorithms(True)`, not warn-only): an op with no
  deterministic kernel raises instead of running (one exception: inside mamba-ssm's SSD backward, whose
  torch.cumsum calls torch flags wholesale, the mode is warn-only for that call: model/ops/mamba_kernels.py); on
  torch >= 2.9 it also puts Inductor in its deterministic mode (no timing-based choices of reduction
  configs, templates or padding), which is set
  explicitly here too (`torch._inductor.config.deterministic`) where the torch version has it;
- `CUBLAS_WORKSPACE_CONFIG=:4096:8` (cuBLAS's deterministic workspace; it must be in the environment
  before the process's first cuBLAS call, so it is set before CUDA starts, or the run refuses);
- cuDNN deterministic, without benchmark mode;
- attention through FlexAttention where the model is compiled (Inductor's template: its backward has no
  atomics) and PyTorch's math SDPA where it is eager (model/blocks.py): cuDNN's and flash's backward kernels
  accumulate in an order that varies; the fused backends are also switched off process-wide, so that
  no compiled pattern can reach them. NVFP4TRAIN_DETERMINISTIC_ATTENTION=math takes math SDPA compiled too
  (it replays runs made with it);
- new tensors are not filled with NaN (torch's deterministic mode fills every torch.empty, a kernel per
  allocation, so that a read of memory nobody wrote shows; every kernel here writes all of its output, and
  the fill changes no bit of a run, fresh or resumed: docs/determinism.md). NVFP4TRAIN_FILL_UNINITIALIZED=1
  turns the fill back on, to hunt such a read;
- Mamba's SSD (model/ssd.py): mamba-ssm's Triton kernels in their own deterministic mode (per-program
  partial sums reduced in a fixed order instead of atomics), each kernel pinned to one configuration
  instead of the one autotuning picks by timing; the chunked PyTorch scan where mamba-ssm is missing.
- the Mamba conv: our Triton kernels, never causal_conv1d's CUDA extension (its backward is not audited).
Our own kernels are deterministic as they stand: the causal conv's backward writes per-tile partial
sums that one torch sum reduces (model/causal_conv.py), the quantizers' amax is a maximum (order-free)
and stochastic rounding draws Philox bits by element index (formats/). docs/determinism.md has the cost.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from nvfp4train.config.schema import ConfigError

log = logging.getLogger(__name__)

FILL_ENV = "NVFP4TRAIN_FILL_UNINITIALIZED"

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the two settings cuBLAS documents as reproducible


def _set_cublas_workspace() -> None:
    """CUBLAS_WORKSPACE_CONFIG=:4096:8 unless a deterministic value is already set; refuses in one line when
    CUDA has already started with another (cuBLAS reads it once, when torch creates its workspace)."""
    value = os.environ.get(CUBLAS_ENV)
    if value in CUBLAS_DETERMINISTIC:
        return
    if value is None and not torch.cuda.is_initialized():
        os.environ[CUBLAS_ENV] = CUBLAS_DETERMINISTIC[0]
        return
    now = f"{CUBLAS_ENV}={value}" if value is not None else f"{CUBLAS_ENV} unset"
    raise ConfigError(
        f"train.deterministic=true needs {CUBLAS_ENV}=:4096:8 (or :16:8) before CUDA starts, "
        f"and this process started CUDA with {now}: set it in the environment of the command"
    )


@contextlib.contextmanager
def deterministic_mode(enabled: bool):
    """Within: the settings above when `enabled`, nothing otherwise. Restores torch's previous modes."""
    if not enabled:
        yield
        return
    from nvfp4train.model.blocks import (
        DETERMINISTIC_ATTENTION_CHOICES,
        DETERMINISTIC_ATTENTION_DEFAULT,
        DETERMINISTIC_ATTENTION_ENV,
    )

    attention = os.environ.get(DETERMINISTIC_ATTENTION_ENV, DETERMINISTIC_ATTENTION_DEFAULT)
    if attention not in DETERMINISTIC_ATTENTION_CHOICES:
        raise ConfigError(
            f"{DETERMINISTIC_ATTENTION_ENV}={attention}: allowed "
            f"{', '.join(DETERMINISTIC_ATTENTION_CHOICES)} (the attention of train.deterministic=true)"
        )
    fill = os.environ.get(FILL_ENV, "0")
    if fill not in ("0", "1"):
        raise ConfigError(
            f"{FILL_ENV}={fill}: allowed 0, 1 (1: torch fills new tensors with NaN in deterministic mode)"
        )
    _set_cublas_workspace()
    saved = {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
        "fill": torch.utils.deterministic.fill_uninitialized_memory,
    }
    inductor = _inductor_config()
    saved_inductor = inductor.deterministic if inductor is not None else None
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.utils.deterministic.fill_uninitialized_memory = fill == "1"
    if inductor is not None:
        inductor.deterministic = True
    log.info("deterministic mode: %s", describe())
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved["algorithms"], warn_only=saved["warn_only"])
        torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
        torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
        torch.backends.cuda.enable_flash_sdp(saved["flash"])
        torch.backends.cuda.enable_mem_efficient_sdp(saved["mem_efficient"])
        torch.backends.cuda.enable_cudnn_sdp(saved["cudnn_sdp"])
        torch.utils.deterministic.fill_uninitialized_memory = saved["fill"]
        if inductor is not None:
            inductor.deterministic = saved_inductor


def _inductor_config():
    """torch._inductor.config when it has the `deterministic` switch (torch >= 2.9), else None."""
    try:
        from torch._inductor import config
    except ImportError:
        return None
    return config if hasattr(config, "deterministic") else None


def describe() -> str:
    """One line for train.log: the settings in force."""
    inductor = _inductor_config()
    return (
        f"torch deterministic algorithms {'on' if torch.are_deterministic_algorithms_enabled() else 'off'}, "
        f"{CUBLAS_ENV}={os.environ.get(CUBLAS_ENV, 'unset')}, cudnn.deterministic="
        f"{torch.backends.cudnn.deterministic}, inductor deterministic="
        f"{inductor.deterministic if inductor is not None else 'n/a (torch too old)'}, attention: "
        f"{os.environ.get('NVFP4TRAIN_DETERMINISTIC_ATTENTION', 'flex')} where compiled (math SDPA where eager), "
        f"new tensors {'filled with NaN' if torch.utils.deterministic.fill_uninitialized_memory else 'not filled'}, "
        "SSD: mamba-ssm Triton in its deterministic mode with pinned configs (PyTorch scan without mamba-ssm), "
        "conv: our Triton kernels"
    )
