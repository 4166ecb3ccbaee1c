"""Process-group setup from torchrun or SLURM, and the data-parallel wrappers (DDP, FSDP2).

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. A task launched by plain
`srun` (no torchrun) has only SLURM_* variables: we translate them, so both launch styles work.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from nvfp4train.config.schema import ConfigError

PARALLEL_MODES = ("ddp", "fsdp2", "hsdp", "deepspeed")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_from_slurm() -> None:
    """Fill torchrun's variables from SLURM's when a task was started by `srun` directly."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ or "SLURM_NTASKS" not in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURM_NODELIST", "127.0.0.1"))
        try:  # the first host of a compressed list such as "gpu[01-04]"
            first = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
            ).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            first = nodelist.split(",")[0]
        os.environ["MASTER_ADDR"] = first
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000))


def init_distributed(device: str = "auto") -> DistInfo:
    """Initialise torch.distributed when launched with several processes; pick this rank's device."""
    _env_from_slurm()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                "train.device=cuda: no CUDA GPU is visible (torch.cuda.is_available() is False); "
                "use train.device=cpu or auto"
            )
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    elif device == "cpu":
        dev = torch.device("cpu")
    else:
        raise ConfigError(f"train.device={device!r}: allowed auto, cpu, cuda")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo",
            rank=rank,
            world_size=world_size,
            device_id=dev if dev.type == "cuda" else None,
        )
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


# train.fsdp_reshard_after_forward=auto keeps the gathered BF16 weights from forward to backward when all of
# them together take at most this share of the device's memory (torchtitan's `default` policy reshards
# every block but the last whenever pipeline parallelism is off, whatever that costs).
KEEP_GATHERED_MAX_SHARE = 1 / 8


def device_memory_bytes(device: torch.device) -> int:
    """The memory the model's tensors live in: the GPU's, or the host's on CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resolve_reshard_after_forward(setting: str, n_params: int, info: DistInfo) -> tuple[bool, str]:
    """train.fsdp_reshard_after_forward as a bool, and why (the trainer logs it).

    Resharding after forward costs a second all-gather of every block in backward (3 collectives of the
    weights per step instead of 2: docs/results/code-measurements.md); not resharding holds every block's
    gathered BF16 weights, 2 bytes a parameter, from its forward until its backward. auto pays that memory when
    it is at most KEEP_GATHERED_MAX_SHARE of the device's (hybrid_1b: 2.0 GB of 80; nemotron_h_8b, 16.2 GB,
    reshards)."""
    if setting in ("true", "false"):
        return setting == "true", f"train.fsdp_reshard_after_forward={setting}"
    gathered = 2 * n_params
    memory = device_memory_bytes(info.device)
    keep = gathered <= KEEP_GATHERED_MAX_SHARE * memory
    verdict = "false: kept from forward to backward" if keep else "true: gathered again in backward"
    return not keep, (
        f"train.fsdp_reshard_after_forward=auto -> {verdict} (the gathered BF16 weights, "
        f"{gathered / 1e9:.1f} GB, are {gathered / memory:.0%} of the {info.device.type} memory's "
        f"{memory / 1e9:.0f} GB; kept when at most {KEEP_GATHERED_MAX_SHARE:.1%})"
    )


def ranks_per_node(world_size: int) -> int:
    """The ranks of one node: torchrun's LOCAL_WORLD_SIZE, else SLURM's tasks per node (srun without
    torchrun; "8(x2)" reads 8), else all of them."""
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(key, "").split("(")[0].split(",")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return world_size


def hsdp_shape(shard_size: int, world_size: int) -> tuple[int, int]:
    """(replicas, shard size) of train.parallel=hsdp with train.hsdp_shard_size=`shard_size` (0: a node)."""
    size = shard_size or ranks_per_node(world_size)
    if world_size % size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ConfigError(
            f"train.hsdp_shard_size={shard_size}{f' (the ranks of a node: {size})' if not shard_size else ''} "
            f"does not divide the {world_size} ranks; allowed: 0 (the ranks of a node) or one of "
            f"{', '.join(map(str, divisors))}"
        )
    return world_size // size, size


def wrap_model(
    model: nn.Module,
    mode: str,
    info: DistInfo,
    reshard_after_forward: bool = True,
    prefetch: int = 1,
    ddp_bucket_cap_mb: int = 100,
    capturable: bool = False,
    hsdp_shard_size: int = 0,
) -> nn.Module:
    """Wrap for data parallelism. World size 1 runs the bare model (DeepSpeed wraps in its own engine).

    capturable: DDP as torch's CUDA-graph notes ask for a step captured with its all-reduce (built on a
    side stream, so that its set-up collectives are not ordered on the stream a capture later uses; its
    runtime statistics, which time the backward with CUDA events on sampled iterations, never sampled
    after DDP's first ten iterations, which the capture's warm-up steps run eagerly)."""
    if mode not in PARALLEL_MODES:
        raise ConfigError(f"train.parallel={mode!r}: allowed {', '.join(PARALLEL_MODES)}")
    if info.world_size == 1 or mode == "deepspeed":
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Gradients as views of DDP's buckets: no copy into the buckets before each all-reduce, and one
        # copy of the gradients in memory instead of two.
        device_ids = [info.local_rank] if info.device.type == "cuda" else None
        if not capturable:
            return DistributedDataParallel(
                model, device_ids=device_ids, bucket_cap_mb=ddp_bucket_cap_mb, gradient_as_bucket_view=True
            )
        side = torch.cuda.Stream(info.device)
        side.wait_stream(torch.cuda.current_stream(info.device))
        with torch.cuda.stream(side):
            ddp = DistributedDataParallel(
                model, device_ids=device_ids, bucket_cap_mb=ddp_bucket_cap_mb, gradient_as_bucket_view=True
            )
        torch.cuda.current_stream(info.device).wait_stream(side)
        ddp._set_ddp_runtime_logging_sample_rate(2**31 - 1)
        return ddp
    mesh = None
    if mode == "hsdp":
        from torch.distributed.device_mesh import init_device_mesh

        replicas, shard = hsdp_shape(hsdp_shard_size, info.world_size)
        mesh = init_device_mesh(info.device.type, (replicas, shard), mesh_dim_names=("replicate", "shard"))
    return shard_fsdp2(model, reshard_after_forward, prefetch, mesh)


def shard_fsdp2(model: nn.Module, reshard_after_forward: bool = True, prefetch: int = 1, mesh=None) -> nn.Module:
    """FSDP2 (torchtitan's layout): one unit per block, the root holding embedding, final norm and head.

    reshard_after_forward=True frees each block's gathered BF16 weights after its forward and gathers
    them again in backward (ZeRO-3 memory); False keeps them until backward (ZeRO-2-like: one all-gather
    per step instead of two, more memory). The last block never reshards: backward needs it at once.
    Each block asks for the next `prefetch` blocks' weights as its forward starts (and the previous
    ones' in backward), so the all-gathers overlap compute even when the CPU does not run ahead;
    prefetch=0 leaves FSDP2's implicit prefetching (the next block, issued when the CPU gets there).
    mesh: a 2-D ("replicate", "shard") DeviceMesh for HSDP (sharded along the second dimension, the
    gradients all-reduced along the first); None shards over every rank."""
    import warnings

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # FSDP2 warns, once per process, when a wrapped module returns a view (our blocks' mixer output is a
    # reshape of the out-projection's 2-D GEMM; the model's loss a view of its sum): an in-place op on it would
    # skip the pre-backward all-gather. Nothing in this model modifies them in place (the residual adds are
    # out of place: RMSNorm.add_and_norm, HybridLM.forward), so the warning says nothing about this model.
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module \(FSDP(Block|HybridLM)\) returned a view tensor", category=UserWarning
    )
    # BF16 compute copies of the sharded FP32 master weights; gradients reduced in FP32.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    if prefetch > 0:
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + prefetch])
            if i > 0:
                block.set_modules_to_backward_prefetch(blocks[max(0, i - prefetch) : i][::-1])
    return model


def reshard_fsdp(model: nn.Module) -> None:
    """Free every FSDP2 module's gathered weights (no-op for a model without FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def broadcast_from_main(obj, info: DistInfo):
    """The main rank's `obj` on every rank (a small picklable value)."""
    if info.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.world_size > 1:
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
