"""All-gather and reduce-scatter bandwidth at the sizes FSDP2 uses for a model, on N GPUs of one node.

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_comm.py --model hybrid_1b --json comm.json
    python -m nvfp4train.launch --standalone --nproc_per_node=2 benchmarks/bench_comm.py --device cpu --sizes-mb 1 4

FSDP2 (nvfp4train.parallel.shard_fsdp2) gathers each block's weights in BF16 (2 bytes a parameter) and
reduce-scatters its gradients in FP32 (4 bytes); the root unit (embedding, final norm, LM head) once
more. For each of those sizes this times the single-tensor all-gather and reduce-scatter (NCCL on
CUDA, gloo on CPU; gloo has no reduce-scatter, so CPU rows are all-gathers only) and prints, per op and
size, the time, the algorithm bandwidth (bytes of the full tensor / time) and the bus bandwidth
(x (N-1)/N, the number nccl-tests reports and scaling_model.py reads). Rank 0 prints the table and writes
--json: {"rows": [{op, what, bytes, world_size, ms, alg_gbytes, bus_gbytes}], "device": ..., "commit": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def fsdp2_sizes(model: str) -> list[tuple[str, int]]:
    """(what, parameters) of the model's FSDP2 units: its largest block, its smallest, and the root."""
    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig

    cfg = ModelConfig.from_dict(load_preset("model", model))
    with torch.device("meta"):
        net = HybridLM(cfg)
    blocks = [sum(p.numel() for p in b.parameters()) for b in net.blocks]
    root = sum(p.numel() for p in net.parameters()) - sum(blocks)
    out = [
        (f"{model} largest block", max(blocks)),
        (f"{model} smallest block", min(blocks)),
        (f"{model} root (embedding, norm, head)", root),
    ]
    return sorted(set(out), key=lambda kv: -kv[1])


def time_op(fn, iters: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time is the collective's
    return elapsed.item() / iters


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hybrid_1b", help="derive the sizes from this model preset")
    ap.add_argument(
        "--sizes-mb",
        nargs="*",
        type=float,
        default=None,
        help="instead: these sizes of the gathered/reduced tensor, MB",
    )
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
    )
    n, rank = dist.get_world_size(), dist.get_rank()
    if args.sizes_mb:
        units = [(f"{mb:g} MB", int(mb * 1e6)) for mb in args.sizes_mb]
        plan = [
            (what, op, nbytes, torch.bfloat16 if op == "all_gather" else torch.float32)
            for what, nbytes in units
            for op in ("all_gather", "reduce_scatter")
        ]
    else:
        plan = []
        for what, params in fsdp2_sizes(args.model):
            plan.append((what + ", bf16 weights", "all_gather", 2 * params, torch.bfloat16))
            plan.append((what + ", fp32 gradients", "reduce_scatter", 4 * params, torch.float32))
    if device.type != "cuda":
        plan = [p for p in plan if p[1] == "all_gather"]  # gloo: no reduce_scatter_tensor
    # torch 2.13 renamed the single-tensor collectives (the old names warn); older torch has only those
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    rows = []
    for what, op, nbytes, dtype in plan:
        elem = torch.tensor([], dtype=dtype).element_size()
        numel = max(n, nbytes // elem // n * n)
        full = torch.empty(numel, dtype=dtype, device=device).normal_()
        shard = torch.empty(numel // n, dtype=dtype, device=device).normal_()
        if op == "all_gather":

            def fn(full=full, shard=shard):
                gather(full, shard)
        else:

            def fn(full=full, shard=shard):
                scatter(shard, full)

        seconds = time_op(fn, args.iters, args.warmup, device)
        size = numel * elem
        alg = size / seconds / 1e9
        rows.append(
            {
                "op": op,
                "what": what,
                "bytes": size,
                "world_size": n,
                "ms": round(seconds * 1e3, 4),
                "alg_gbytes": round(alg, 2),
                "bus_gbytes": round(alg * (n - 1) / n, 2),
            }
        )
        del full, shard
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"{n} x {name}, {dist.get_backend()}; mean of {args.iters} after {args.warmup} warm-up")
        print(f"{'op':<15} {'MB':>9} {'ms':>9} {'alg GB/s':>9} {'bus GB/s':>9}  what")
        for r in rows:
            print(
                f"{r['op']:<15} {r['bytes'] / 1e6:>9.1f} {r['ms']:>9.3f} {r['alg_gbytes']:>9.1f} "
                f"{r['bus_gbytes']:>9.1f}  {r['what']}"
            )
        if args.json:
            from nvfp4train.data.paths import git_commit

            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps(
                    {
                        "device": name,
                        "backend": dist.get_backend(),
                        "world_size": n,
                        "commit": git_commit(short=True),
                        "rows": rows,
                    },
                    indent=1,
                )
                + "\n"
            )
            print(f"wrote {args.json}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
