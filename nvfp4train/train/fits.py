"""Will the run fit in memory? A lower bound of what one rank holds, from the config alone, checked before
anything is allocated, so that `train.global_batch_size=100000000` or `model.d_model=1000000` is one line
naming the key and the size, not minutes of swapping and an out-of-memory kill.

The bound counts only what no setting can avoid: 16 bytes a parameter (FP32 weights, gradients and AdamW's
two moments; divided over the ranks when they are sharded), one BF16 hidden state per block and token of a
micro-batch (what even full activation checkpointing keeps for backward), and the data loader's plan of a
step (two int64s a sequence of the global batch, on the host). A run refused here could not have run; a run
let through may still need several times more.
"""

from __future__ import annotations

import os

import torch

from nvfp4train.config import ConfigError, RunConfig

STATE_BYTES_PER_PARAM = 16  # fp32 weight + fp32 gradient + AdamW exp_avg + exp_avg_sq
HIDDEN_BYTES = 2  # one bf16 value per block, token and model dimension
PLAN_BYTES_PER_SEQUENCE = 16  # the loader's global sample index and source (int64 each)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def host_memory() -> int:
    """This machine's memory shared by its ranks (LOCAL_WORLD_SIZE, torchrun's), in bytes."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return host_memory()


def parameter_count(cfg: RunConfig) -> int:
    return cfg.model.num_params()  # from the config: no model is built


def check_fits(cfg: RunConfig, world_size: int, device: torch.device, micro_derived: bool = False) -> None:
    """Refuse, in one line naming the key, a run whose lower bound (module docstring) exceeds the memory of
    its device (a GPU's total memory; on the CPU this machine's memory over its ranks). `cfg.train` has its
    micro-batch resolved; micro_derived: from train.global_batch_size over the ranks (none was given)."""
    t, m = cfg.train, cfg.model
    params = parameter_count(cfg)
    shards = world_size if world_size > 1 and t.parallel != "ddp" else 1
    state = params * STATE_BYTES_PER_PARAM / shards
    hidden = t.micro_batch_size * t.seq_len * m.d_model * m.n_blocks * HIDDEN_BYTES
    plan = t.global_batch_size * PLAN_BYTES_PER_SEQUENCE
    on_device = state + hidden + (plan if device.type != "cuda" else 0)
    micro = f"train.micro_batch_size={t.micro_batch_size}" + (
        f" (train.global_batch_size={t.global_batch_size} over {world_size} rank(s))" if micro_derived else ""
    )
    parts = {  # (bytes, what they are, what to lower)
        "state": (
            state,
            f"model: {params:,} parameters ({_gib(state)} of weights, gradients and AdamW state)",
            "use a smaller model (model.d_model, model.pattern, model.vocab_size), or shard it over more GPUs "
            "(train.parallel=fsdp2)",
        ),
        "hidden": (
            hidden,
            f"{micro} x train.seq_len={t.seq_len} tokens x model.d_model={m.d_model} x {m.n_blocks} blocks "
            f"({_gib(hidden)} of activations)",
            "lower train.seq_len, or train.micro_batch_size (gradient accumulation keeps train.global_batch_size)",
        ),
        "plan": (
            plan,
            f"train.global_batch_size={t.global_batch_size} ({_gib(plan)} for the data order of a step)",
            "lower train.global_batch_size",
        ),
    }
    checks = [(on_device, device_memory(device), str(device.type))]
    if device.type == "cuda":
        checks.append((plan, host_memory(), "host"))
    for needed, available, where in checks:
        if needed > available:
            names = ("plan",) if where == "host" else ("state", "hidden", "plan")
            largest = max(names, key=lambda k: parts[k][0])
            _, what, lower = parts[largest]
            raise ConfigError(
                f"{what}: the run needs at least {_gib(needed)} of {where} memory per rank, more than the "
                f"{_gib(available)} there is; {lower}"
            )
