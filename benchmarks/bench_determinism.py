"""What `train.deterministic=true` costs, piece by piece: the trainer's step with the whole mode, without it,
and with the mode minus one of its pieces at a time, so the cost of each piece reads off one table.

    python -m benchmarks.bench_determinism --model hybrid_5m --precision nvfp4 --seq 1024 --batch 32
    python -m benchmarks.bench_determinism --variants off on on+nofill --steps 20   # a subset

Each variant runs in its own process (deterministic settings, mamba-ssm's mode and Triton's pinned
configurations are process state), one after the other on the same GPU, sharing Triton's and Inductor's
caches, so only the first pays compilation and autotuning. A variant names what it takes out of the mode:

    off             no deterministic mode (the baseline)
    on              train.deterministic=true as the trainer runs it (FlexAttention where compiled, no NaN fill)
    on+math+fill    ... with math SDPA and new tensors NaN-filled (NVFP4TRAIN_DETERMINISTIC_ATTENTION=math
                    NVFP4TRAIN_FILL_UNINITIALIZED=1: the settings the committed campaign ran with)
    on+math         ... with math SDPA only
    on+fill         ... with the NaN fill only
    on-ssd-free     ... mamba-ssm's SSD kernels in their default (atomic, autotuned) mode
    on-ssd-tuned    ... mamba-ssm's deterministic SSD kernels, autotuned instead of pinned to one configuration
    on-inductor     ... Inductor not in its deterministic mode (reduction configurations chosen freely)
    on-conv         ... causal_conv1d's CUDA extension for the Mamba conv where it is installed

Timing is bench_train's (the trainer's TorchEngine.train_step, compiled and with the CUDA graph by default,
random tokens, after warm-up). Rows merge into --out (one per model x seq x batch x precision x variant x GPU):
    {model, seq, batch, precision, variant, step_ms, tokens_per_s, cost_vs_off, mfu, peak_gib, gpu, commit}
A piece taken out of the math+fill settings reads `on+math+fill-ssd-free` and so on.
A variant that is not deterministic (on-ssd-free, on-ssd-tuned across fresh caches, on-inductor, on-conv) is a
measurement of a piece's price, not a setting to train with.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIECES = ("ssd-free", "ssd-tuned", "inductor", "conv")  # what an `on-<piece>` variant takes out
VARIANTS = (
    "off", "on", "on+math+fill", "on+math", "on+fill", *(f"on-{p}" for p in PIECES),
    *(f"on+math+fill-{p}" for p in PIECES),
)  # fmt: skip
KEY = ("model", "seq", "batch", "precision", "variant", "gpu")


def _take_out(piece: str) -> None:
    """Inside deterministic mode: undo the one piece named (one of PIECES)."""
    from nvfp4train.model import ssd
    from nvfp4train.model.ops import mamba_kernels

    if piece == "inductor":
        from torch._inductor import config

        config.deterministic = False
        config.write_are_deterministic_algorithms_enabled = False
    elif piece in ("ssd-free", "ssd-tuned"):
        free = piece == "ssd-free"

        def unpinned() -> None:
            if mamba_kernels._PINNED_STATE is not False:
                mamba_kernels.pin_triton_configs(
                    [mamba_kernels.import_mamba_triton(n) for n in mamba_kernels.SSD_TRITON_MODULES], False
                )
                switch = sys.modules.get("mamba_ssm.utils.determinism")
                if switch is not None:
                    switch.set_deterministic_mode(False if free else True)
                mamba_kernels._PINNED_STATE = False

        ssd.match_triton_determinism = unpinned  # the scan's custom ops call it by this module's name
    elif piece == "conv":
        real = ssd.conv_backend
        ssd.conv_backend = lambda is_cuda, deterministic, ext, tri: real(is_cuda, False, ext, tri)


def worker(args) -> dict:
    settings, _, piece = args.variant.partition("-")
    parts = settings.split("+")[1:]
    os.environ["NVFP4TRAIN_DETERMINISTIC_ATTENTION"] = "math" if "math" in parts else "flex"
    os.environ["NVFP4TRAIN_FILL_UNINITIALIZED"] = "1" if "fill" in parts else "0"
    from nvfp4train.train.build import persistent_kernel_caches

    persistent_kernel_caches()
    import torch

    from benchmarks.bench_train import bench_one
    from nvfp4train.config import load_preset
    from nvfp4train.model import ModelConfig
    from nvfp4train.train.determinism import deterministic_mode

    model_cfg = ModelConfig.from_dict(load_preset("model", args.model))
    with deterministic_mode(args.variant != "off"):
        if piece:
            _take_out(piece)
        row = bench_one(
            args.model,
            model_cfg,
            args.precision,
            args.batch,
            args.seq,
            args.steps,
            args.warmup,
            torch.device("cuda"),
            "true",
            False,
            cuda_graph=args.cuda_graph,
            profile=args.profile,
        )
    return {**row, "variant": args.variant}


def merge_rows(path: Path, rows: list[dict]) -> None:
    existing = json.loads(path.read_text()) if path.is_file() else []
    merged = {tuple(r.get(k) for k in KEY): r for r in existing}
    merged.update({tuple(r.get(k) for k in KEY): r for r in rows})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sorted(merged.values(), key=lambda r: [str(r.get(k)) for k in KEY]), indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hybrid_5m")
    ap.add_argument("--precision", default="nvfp4")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cuda-graph", choices=["true", "false"], default="true")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--profile", type=Path, help="profile one more step per variant (use --cuda-graph false)")
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/bench/determinism_pieces.json")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the worker's own
    ap.add_argument("--row", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant is not None:
        args.row.write_text(json.dumps(worker(args)))
        return
    rows = []
    for variant in args.variants:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "benchmarks.bench_determinism", "--variant", variant, "--row", f.name]
            for flag in ("model", "precision", "seq", "batch", "steps", "warmup", "cuda_graph"):
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            if args.profile is not None:
                cmd += ["--profile", str(args.profile / variant)]
            print(f"+ {variant}", flush=True)
            done = subprocess.run(cmd, cwd=REPO)
            if done.returncode != 0:
                print(f"  {variant}: exit status {done.returncode}, no row", flush=True)
                continue
            rows.append(json.loads(Path(f.name).read_text()))
        base = next((r for r in rows if r["variant"] == "off"), None)
        for r in rows:
            r["cost_vs_off"] = round(1 - r["tokens_per_s"] / base["tokens_per_s"], 4) if base else None
        merge_rows(args.out, rows)  # after each variant: a stopped invocation keeps what it measured
    print(f"\n{'variant':<22} {'step ms':>9} {'tokens/s':>11} {'cost vs off':>12}")
    for r in rows:
        cost = f"{100 * r['cost_vs_off']:.1f}%" if r["cost_vs_off"] is not None else "-"
        print(f"{r['variant']:<22} {r['step_ms']:>9.2f} {r['tokens_per_s']:>11.0f} {cost:>12}")
    if rows:
        r = rows[0]
        print(f"({r['model']} {r['precision']} seq {r['seq']} x {r['batch']}, {r['gpu']}, commit {r['commit']})")


if __name__ == "__main__":
    main()
