"""Loader throughput from one core over memory-mapped shards (the target: at least 1M tokens/s).

    python -m benchmarks.bench_loader                       # the bundled corpus, seq_len 2048
    python -m benchmarks.bench_loader --config configs/data/corpora.yaml --seq-len 4096 --micro-batch 8

Counts the tokens of the (x, y) micro-batches the trainer would receive (micro_batch * seq_len per call),
including the blend schedule, the per-step plan and the copy into torch tensors. Torch and numpy are
limited to one thread so the number is per core.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import yaml

from nvfp4train.data import build_train_loader
from nvfp4train.data.paths import resolve_path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/data/bundled.yaml")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = yaml.safe_load(resolve_path(args.config).read_text())
    global_batch = args.micro_batch * args.grad_accum
    # Enough total samples that the run crosses both phase boundaries within the timed window.
    loader = build_train_loader(
        cfg,
        seq_len=args.seq_len,
        global_batch_size=global_batch,
        micro_batch_size=args.micro_batch,
        rank=0,
        world_size=1,
        seed=0,
        total_samples=global_batch * 200,
    )
    for _ in range(args.grad_accum):  # warm-up: first epoch shuffles, page cache
        loader.next_microbatch()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        loader.next_microbatch()
        calls += 1
    elapsed = time.perf_counter() - start
    tokens = calls * args.micro_batch * args.seq_len
    stats = loader.stats()
    print(
        f"{tokens / elapsed / 1e6:.2f}M tokens/s on one core ({calls} micro-batches of {args.micro_batch}x"
        f"{args.seq_len} in {elapsed:.1f}s; reached phase {stats['data/phase']}, "
        f"{stats['data/consumed_tokens'] / 1e6:.1f}M tokens consumed)"
    )


if __name__ == "__main__":
    main()
