"""What Trainer(cfg) sets up and checks before it writes anything: the host (CPU threads, kernel caches),
out_dir's writability, and the model (with the precision package's linears), precision controller and data,
all validated, and the peak FLOP/s MFU is measured against."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import torch

from nvfp4train import parallel
from nvfp4train.config import ConfigError, RunConfig
from nvfp4train.data import DataConfig, build_train_loader, build_val_data
from nvfp4train.data.paths import resolve_path
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.model.mfu import peak_flops
from nvfp4train.model.ops import triton_ssd_available
from nvfp4train.precision import PrecisionController, build_linear_factory, gemm_peak_kind


def persistent_kernel_caches() -> str:
    """Triton's compiled kernels and autotuning results (mamba-ssm's SSD kernels, Inductor's) in one directory
    that the runs of this machine share, so only the first run pays the autotuning: TRITON_CACHE_DIR when set
    (shared storage shares it between nodes), else ~/.cache/nvfp4train/triton; Inductor's cache beside it
    unless TORCHINDUCTOR_CACHE_DIR is set. Set before the first kernel compiles (Triton reads them then)."""
    root = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".cache" / "nvfp4train" / "triton")
    os.environ.setdefault("TRITON_CACHE_DIR", str(root))
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # Triton >= 3.2 keeps autotuning choices there
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root.parent / "inductor"))
    return str(root)


def running_elsewhere(samples: int = 5, interval_s: float = 0.02) -> int | None:
    """How many other processes are running on the CPUs right now (Linux's /proc/loadavg: runnable tasks,
    this one excluded), the median of a few samples; None where it cannot be read."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(interval_s)
    return max(0, sorted(counts)[len(counts) // 2])


def cpu_threads() -> str:
    """Pick torch's CPU threads unless OMP_NUM_THREADS (or torchrun, which sets it) did: the cores this
    process may use (os.sched_getaffinity) that other processes are not busy on, at least 1. Busy: the
    1-minute load average, unless fewer processes run right now (running_elsewhere): right after `pip install`
    the average still counts pip for a minute, and would cost the first run half of a 2-core machine.
    torch's default (every core) collapses on a shared machine, where threads wait on cores other processes
    hold (docs/results/code-measurements.md); on an idle machine it keeps every core. The thread count changes
    the last bits of a CPU run (a matmul's reduction is split among the threads), so a resumed run takes the
    count its checkpoint recorded (resume_cpu_threads) and OMP_NUM_THREADS=N makes fresh runs repeatable.
    Returns the banner's note."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if os.environ.get("OMP_NUM_THREADS"):
        n = torch.get_num_threads()
        return f" ({n} thread{'s' if n > 1 else ''}: OMP_NUM_THREADS)"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    now = running_elsewhere()
    busy = load if now is None else min(load, now)
    threads = max(1, min(cores, cores - round(busy)))
    torch.set_num_threads(threads)
    if threads == cores:
        return f" ({threads} thread{'s' if threads > 1 else ''})"
    running = "" if now is None else f", {now} other process{'es' if now != 1 else ''} running"
    return f" ({threads} of {cores} cores: load average {load:.1f}{running}; OMP_NUM_THREADS=N to choose)"


def resume_cpu_threads(recorded) -> tuple[str | None, str | None]:
    """A CPU run resumed from a checkpoint that recorded `recorded` threads: torch's thread count set to it,
    unless OMP_NUM_THREADS chose one (then a note when they differ), so that the resumed steps repeat the
    uninterrupted run's bits. Returns (the banner's thread note or None, a resume note or None)."""
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 1:
        return None, None  # a checkpoint written before the count was recorded
    now = torch.get_num_threads()
    if os.environ.get("OMP_NUM_THREADS"):
        if now == recorded:
            return None, None
        return None, (
            f"CPU threads: {now} (OMP_NUM_THREADS), the checkpoint's run used {recorded}: the resumed steps may "
            "differ from an uninterrupted run in their last bits"
        )
    torch.set_num_threads(recorded)
    return f" ({recorded} thread{'s' if recorded > 1 else ''}: as the run being resumed)", None


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def reuse_freed_host_memory() -> bool:
    """Make glibc's malloc keep the memory torch frees and hand it to the next step's tensors, rather than
    give it back to the kernel. torch has no caching allocator for CPU tensors: each step's large ones
    (above glibc's mmap threshold, at most 32 MiB; the loss's FP32 logits are larger) are mapped fresh and
    unmapped when freed, and the kernel faults in and zeroes every page of them again on every step, which
    cost a CPU run of the default model more time in the kernel than in its own arithmetic. With mmap off
    and the heap never trimmed the freed memory is reused; the process keeps its peak heap until it exits.
    The numbers do not change. Not where the user tunes malloc (GLIBC_TUNABLES, MALLOC_*_), and only with
    glibc; returns whether it was set."""
    if any(k == "GLIBC_TUNABLES" or (k.startswith("MALLOC_") and k.endswith("_")) for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt if hasattr(libc, "gnu_get_libc_version") else None
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        mallopt = None
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def check_out_dir_writable(out_dir: Path) -> None:
    """Fail early if out_dir cannot be created or written, without creating anything yet."""
    existing = out_dir.absolute()
    while not existing.exists():
        if existing.is_symlink():  # mkdir would say "File exists" of a link to nothing
            raise ConfigError(
                f"out_dir={str(out_dir)!r}: {existing} is a symbolic link to {os.readlink(existing)}, which does "
                "not exist; create its target or choose another out_dir"
            )
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"out_dir={str(out_dir)!r}: not writable ({existing} is not a writable directory)")


def data_cache_dir(data: DataConfig) -> Path | None:
    try:
        return resolve_path(data.cache_dir or "data/cache", cache=True)
    except (TypeError, ValueError):
        return None  # the data config's own check names the key


def build_model_and_data(cfg: RunConfig, info: parallel.DistInfo):
    """Model (with the precision package's linears), precision controller and data, all validated."""
    model_cfg, policy = cfg.model, cfg.precision  # parsed and checked once, by RunConfig
    t = cfg.train
    try:
        loader = build_train_loader(
            cfg.data,
            seq_len=t.seq_len,
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=info.rank,
            world_size=info.world_size,
            seed=cfg.seed,
            total_samples=t.max_steps * t.global_batch_size,
        )
        val_data = (
            build_val_data(cfg.data, seq_len=t.seq_len, max_sequences_per_domain=t.eval_sequences)
            if t.eval_sequences
            else {}
        )  # 0: no held-out evaluation
        # on the device for the whole run: an evaluation copies no tokens (train/heldout.py)
        val_data = {source: seqs.to(info.device) for source, seqs in val_data.items()}
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"data: {e}") from None
    if loader.tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
            f"{loader.tokenizer.vocab_size} tokens (data.tokenizer)"
        )

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    try:  # a backend that cannot run here (e.g. backend=te, nvfp4 on Hopper) is one line, exit 2
        factory = build_linear_factory(
            policy, n_blocks=len(model_cfg.pattern), seed=cfg.seed, modules=model_cfg.linear_modules()
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    model = build_model(model_cfg, lambda: HybridLM(model_cfg, layer_factory=factory), info.device)
    controller = PrecisionController(policy, model)
    return model_cfg, model, controller, loader, val_data


def build_model(model_cfg: ModelConfig, build, device: torch.device):
    """build() on `device`, refusing in one line what cannot run there: the Triton SSD off CUDA, and a
    model whose FP32 weights (built in host memory first) do not fit: counted from the config, and
    an allocation that fails anyway is caught."""
    if model_cfg.ssd_backend == "triton" and (device.type != "cuda" or not triton_ssd_available()):
        raise ConfigError(
            f"model.ssd_backend=triton needs a CUDA GPU and mamba-ssm's Triton kernels (device "
            f"{device.type}); use model.ssd_backend=auto or torch"
        )
    n_params = model_cfg.num_params()
    need = (
        f"model {model_cfg.name}: {n_params:,} parameters need {4 * n_params / 1e9:,.1f} GB for the "
        "FP32 weights alone (about 4x that to train: gradients and AdamW moments)"
    )
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 4 * n_params > host:
        raise ConfigError(f"{need}; this machine has {host / 1e9:,.1f} GB of memory: choose a smaller model")
    try:
        return build().to(device)
    except (MemoryError, RuntimeError) as e:  # CUDA's OutOfMemoryError and the CPU allocator's are RuntimeErrors
        if not isinstance(e, (MemoryError, torch.OutOfMemoryError)) and "can't allocate memory" not in str(e):
            raise
        raise ConfigError(f"{need}; they could not be allocated on {device.type}: choose a smaller model") from None


def mfu_peak(cfg: RunConfig, controller: PrecisionController, info: parallel.DistInfo) -> tuple[float, str] | None:
    """The peak FLOP/s MFU is measured against (None off CUDA or on a GPU not in the table)."""
    gemm_precision = gemm_peak_kind(controller.policy, controller.backend_name)  # emulated: the BF16 peak
    return peak_flops(info.device, gemm_precision) if info.device.type == "cuda" else None
