"""Data-parallel training throughput on one node, through the trainer's own command: one GPU, DDP,
FSDP2 (at its defaults and resharding), DeepSpeed ZeRO-1/2 and NVFP4 under FSDP2, then bench_comm.py.

    python benchmarks/bench_distributed.py                       # 2 GPUs, hybrid_1b seq 4096, batch 8, micro 4
    python benchmarks/bench_distributed.py --runs 1gpu ddp fsdp2 fsdp2_reshard --no-comm
    python benchmarks/bench_distributed.py --runs zero1 zero2 nvfp4_fsdp2    # vs 1 GPU: the row of the call above
    python benchmarks/bench_distributed.py --device cpu --model hybrid_tiny --seq 64 --steps 4   # a smoke test
    python benchmarks/bench_distributed.py --runs 1gpu fsdp2 --no-comm --profile /tmp/prof   # + where time goes

Each run is `python -m nvfp4train.launch --standalone --nproc_per_node=N -m nvfp4train.train ...` (the
one-GPU run: `python -m nvfp4train.train ...`) with the trainer's defaults (train.compile and train.cuda_graph
auto: compiled on CUDA, the step captured as a CUDA graph on one GPU and under FSDP2), no evaluation, one
after another. From each run's metrics.jsonl: tokens/s as the mean of the logged steps after the first half
(compilation, autotuning and CUDA-graph capture happen before), peak memory (rank 0), the final loss. It
prints one table and merges a row per run into --out, in the format of docs/results/bench/train.json plus the
keys parallel, gpus, micro_batch, reshard_after_forward, zero_stage, vs_1gpu, final_loss and command.
DeepSpeed runs are not compiled (its engine runs the eager model). Transformer Engine layers
(precision.backend=te) under FSDP2 are not part of it: add `--runs te_1gpu te_fsdp2` where TE is installed. A
multi-GPU run's vs_1gpu is against the one-GPU run of the same precision and backend (nvfp4_fsdp2 against
nvfp4_1gpu): of this invocation, else the row of an earlier one on the same GPU model in --out.

The final loss is a sanity value, not a check that runs agree: the runs stop inside the learning-rate
warmup, where hybrid_1b's loss jumps about and any difference in the first step grows (NVFP4 on one GPU
with and without its CUDA graph differed by 4.5% at step 8 and 1.2% at step 16 on an H200). That FSDP2
tracks one GPU is tests/gpu/test_distributed_gpu.py::test_fsdp2_tracks_one_gpu.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name -> (GPUs, overrides beyond the common ones)
RUNS = {
    "1gpu": (1, []),
    "ddp": (2, ["train.parallel=ddp"]),
    "ddp_bucket25": (2, ["train.parallel=ddp", "train.ddp_bucket_cap_mb=25"]),
    "ddp_bucket400": (2, ["train.parallel=ddp", "train.ddp_bucket_cap_mb=400"]),
    "fsdp2": (2, ["train.parallel=fsdp2"]),
    "fsdp2_prefetch2": (2, ["train.parallel=fsdp2", "train.fsdp_prefetch=2"]),
    "fsdp2_prefetch0": (2, ["train.parallel=fsdp2", "train.fsdp_prefetch=0"]),
    "fsdp2_reshard": (2, ["train.parallel=fsdp2", "train.fsdp_reshard_after_forward=true"]),
    # HSDP as 2 replicas of 1 shard: its replicate all-reduce on one node (a node's GPUs form one shard group
    # by default, which on one node is fsdp2)
    "hsdp_2x1": (2, ["train.parallel=hsdp", "train.hsdp_shard_size=1"]),
    "zero1": (2, ["train.parallel=deepspeed", "train.zero_stage=1"]),
    "zero2": (2, ["train.parallel=deepspeed", "train.zero_stage=2"]),
    "nvfp4_fsdp2": (2, ["train.parallel=fsdp2", "precision=nvfp4"]),
    "nvfp4_1gpu": (1, ["precision=nvfp4"]),
    "nvfp4_ddp": (2, ["train.parallel=ddp", "precision=nvfp4", "train.cuda_graph=false"]),
    # DDP's (FSDP2's) step captured as a CUDA graph after 11 (2) eager steps: these run at least GRAPHED_STEPS
    # steps
    "ddp_graph": (2, ["train.parallel=ddp", "train.cuda_graph=true"]),
    "nvfp4_ddp_graph": (2, ["train.parallel=ddp", "precision=nvfp4", "train.cuda_graph=true"]),
    "fsdp2_graph": (2, ["train.parallel=fsdp2", "train.cuda_graph=true"]),
    "nvfp4_fsdp2_graph": (2, ["train.parallel=fsdp2", "precision=nvfp4", "train.cuda_graph=true"]),
    "fp8_fsdp2_graph": (2, ["train.parallel=fsdp2", "precision=fp8_tensorwise", "train.cuda_graph=true"]),
    # FSDP2's steps without the capture that train.cuda_graph=auto makes
    "fsdp2_eager": (2, ["train.parallel=fsdp2", "train.cuda_graph=false"]),
    "nvfp4_fsdp2_eager": (2, ["train.parallel=fsdp2", "precision=nvfp4", "train.cuda_graph=false"]),
    "fp8_fsdp2_eager": (2, ["train.parallel=fsdp2", "precision=fp8_tensorwise", "train.cuda_graph=false"]),
    "fp8_1gpu": (1, ["precision=fp8_tensorwise"]),
    "fp8_fsdp2": (2, ["train.parallel=fsdp2", "precision=fp8_tensorwise"]),
    "fp8_ddp": (2, ["train.parallel=ddp", "precision=fp8_tensorwise", "train.cuda_graph=false"]),
    "fp8_ddp_graph": (2, ["train.parallel=ddp", "precision=fp8_tensorwise", "train.cuda_graph=true"]),
    "te_1gpu": (1, ["precision=fp8_tensorwise", "precision.backend=te"]),
    "te_fsdp2": (2, ["train.parallel=fsdp2", "precision=fp8_tensorwise", "precision.backend=te"]),
}
DEFAULT_RUNS = ["1gpu", "ddp", "fsdp2", "fsdp2_reshard", "zero1", "zero2", "nvfp4_fsdp2"]
# a run that captures DDP's step replays it from step 12: 30 steps time 15 replays (the second half)
GRAPHED_STEPS = 30
PROFILED_STEPS = 2  # --profile: steps run and profiled after the timed ones


def timed_steps(name: str, args) -> int:
    """The steps run `name` runs before any profiled ones: --steps, at least GRAPHED_STEPS where a multi-GPU
    step is captured (DDP's first 11 run eagerly)."""
    graphed = RUNS[name][0] > 1 and "train.cuda_graph=true" in RUNS[name][1]
    return max(args.steps, GRAPHED_STEPS) if graphed else args.steps


def command(name: str, out_dir: Path, args) -> list[str]:
    gpus, extra = RUNS[name]
    gpus = args.gpus if gpus > 1 else 1
    n_steps = timed_steps(name, args)
    common = [
        f"model={args.model}",
        f"train.seq_len={args.seq}",
        f"train.global_batch_size={args.batch}",
        f"train.micro_batch_size={args.micro}",
        f"train.max_steps={n_steps + (PROFILED_STEPS if args.profile else 0)}",
        "train.log_every=2",
        "train.eval_sequences=0",
        "train.progress=false",
        "train.resume=never",
        f"train.device={args.device}",
        f"out_dir={out_dir}",
    ]
    if args.profile:  # after the timed steps, which the row's numbers come from
        common += [f"train.profile_start={n_steps + 1}", f"train.profile_steps={PROFILED_STEPS}"]
    if gpus == 1:
        return [sys.executable, "-m", "nvfp4train.train", *common, *extra]
    return [
        sys.executable,
        "-m",
        "nvfp4train.launch",
        "--standalone",
        f"--nproc_per_node={gpus}",
        "-m",
        "nvfp4train.train",
        *common,
        *extra,
    ]


def summarize(name: str, out_dir: Path, args) -> dict:
    """The row of one finished run, from its metrics.jsonl and train.log."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    n_steps = timed_steps(name, args)
    steps = [r for r in records if "loss" in r and "tokens_per_s" in r and r["step"] <= n_steps]  # not profiled
    timed = [r for r in steps if r["step"] > n_steps // 2] or steps[-1:]
    tokens_per_s = sum(r["tokens_per_s"] for r in timed) / len(timed)
    log = (out_dir / "train.log").read_text() if (out_dir / "train.log").is_file() else ""
    backend = re.search(r"\| precision \S+ \((\w+)\)", log)
    reshard = re.search(r"fsdp_reshard_after_forward=(?:auto -> )?(true|false)", log)
    gpus, extra = RUNS[name]
    gpus = args.gpus if gpus > 1 else 1
    parallel = next(
        (o.split("=")[1] for o in extra if o.startswith("train.parallel=")), "single" if gpus == 1 else "ddp"
    )
    precision = next((o.split("=")[1] for o in extra if o.startswith("precision=")), "bf16")
    mfu = [r["mfu"] for r in timed if "mfu" in r]
    return {
        "model": args.model,
        "seq": args.seq,
        "batch": args.batch,
        "precision": precision,
        "backend": backend.group(1) if backend else None,
        "compiled": args.device == "cuda" and parallel != "deepspeed",
        "cuda_graph": "cuda graph: captured the step" in log,
        "step_ms": round(args.batch * args.seq / tokens_per_s * 1e3, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(sum(mfu) / len(mfu), 4) if mfu else None,
        "peak_gib": round(max((r.get("peak_mem_gib") or 0) for r in steps), 3) if steps else None,
        "gpu": gpu_name(args.device),
        "commit": commit(),
        "parallel": parallel,
        "gpus": gpus,
        "micro_batch": args.micro,
        "reshard_after_forward": (reshard.group(1) == "true") if reshard else None,
        "zero_stage": next((int(o.split("=")[1]) for o in extra if o.startswith("train.zero_stage=")), None),
        "final_loss": round(steps[-1]["loss"], 4) if steps else None,
        "run": name,
    }


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else "cuda"


def commit() -> str:
    sys.path.insert(0, str(REPO))
    from nvfp4train.data.paths import git_commit

    return git_commit(short=True)


KEY = (
    "model",
    "seq",
    "batch",
    "precision",
    "backend",
    "parallel",
    "gpus",
    "reshard_after_forward",
    "zero_stage",
    "run",
    "gpu",
)


def merge_rows(path: Path, rows: list[dict]) -> None:
    """Rows keyed by configuration and GPU model: a run on another GPU adds a row, the same one replaces it."""
    existing = json.loads(path.read_text()) if path.is_file() else []
    merged = {tuple(r.get(k) for k in KEY): r for r in existing}
    merged.update({tuple(r.get(k) for k in KEY): r for r in rows})
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(merged.values(), key=lambda r: tuple(str(r.get(k)) for k in KEY))
    path.write_text(json.dumps(ordered, indent=1) + "\n")


def one_gpu_run(name: str) -> str | None:
    """The one-GPU run a run is compared with: the one with the same precision overrides (None: there is none)."""
    precision = [o for o in RUNS[name][1] if o.startswith("precision")]
    return next((n for n, (gpus, extra) in RUNS.items() if gpus == 1 and extra == precision), None)


def earlier_baselines(args) -> dict[str, tuple[float, str]]:
    """One-GPU rows of earlier invocations with the same model, shape and GPU: run name -> (tokens/s, commit)."""
    if not args.out.is_file():
        return {}
    gpu = gpu_name(args.device)
    return {
        r["run"]: (r["tokens_per_s"], str(r.get("commit")))
        for r in json.loads(args.out.read_text())
        if r.get("gpus") == 1
        and r.get("model") == args.model
        and r.get("seq") == args.seq
        and r.get("batch") == args.batch
        and r.get("gpu") == gpu
        and r.get("run") in RUNS
    }


def baseline(name: str, rows: list[dict], earlier: dict[str, tuple[float, str]]) -> tuple[float | None, str]:
    """tokens/s of run `name`'s one-GPU counterpart, and where it comes from: this invocation, else --out."""
    single = one_gpu_run(name)
    here = next((r["tokens_per_s"] for r in rows if r.get("run") == single and "error" not in r), None)
    if here is not None:
        return here, f"{single} above"
    if single in earlier:
        return earlier[single][0], f"{single} of commit {earlier[single][1]} in --out"
    return None, f"no {single} row" if single else "no one-GPU run of this precision"


def finished_rows(rows: list[dict], earlier: dict[str, tuple[float, str]]) -> list[dict]:
    """The rows of the runs that finished, with vs_1gpu, as --out stores them."""
    done = []
    for r in rows:
        if "error" not in r:
            base = baseline(r["run"], rows, earlier)[0]
            r["vs_1gpu"] = round(r["tokens_per_s"] / base, 3) if base else None
            done.append({k: v for k, v in r.items() if k != "seconds"})
    return done


def unavailable(name: str) -> str | None:
    """Why run `name` cannot start here (None: it can), found without starting it."""
    if "precision.backend=te" in RUNS[name][1] and importlib.util.find_spec("transformer_engine") is None:
        return "transformer_engine is not installed (docs/results/te.md)"
    if "train.parallel=deepspeed" in RUNS[name][1] and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install 'nvfp4train[deepspeed]')"
    return None


def print_table(rows: list[dict], earlier: dict[str, tuple[float, str]]) -> None:
    print("\n| run | GPUs | tokens/s | vs 1 GPU | against | peak GiB | final loss | reshard | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            what = r["error"] if r["error"].startswith("skipped") else f"failed: {r['error']}"
            print(f"| {r['run']} | {r['gpus']} | {what} | | | | | | {r['seconds']:.0f} |")
            continue
        base, source = baseline(r["run"], rows, earlier)
        vs = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        reshard = "" if r["reshard_after_forward"] is None else str(r["reshard_after_forward"]).lower()
        print(
            f"| {r['run']} | {r['gpus']} | {r['tokens_per_s'] / 1e3:.1f}k | {vs} | {source} | {r['peak_gib']} | "
            f"{r['final_loss']} | {reshard} | {r['seconds']:.0f} |"
        )


def rest_of(argv: list[str] | None, left_out: list[str]) -> list[str]:
    """This invocation's arguments for the runs in `left_out` only (and bench_comm where it is among them)."""
    kept, skipping = [], False
    for arg in argv if argv is not None else sys.argv[1:]:
        if arg.startswith("-"):
            skipping = arg == "--runs"
            if skipping or arg.startswith("--runs=") or arg == "--no-comm":
                continue
        elif skipping:
            continue
        kept.append(arg)
    runs = [name for name in left_out if name in RUNS]
    return [*kept, *(["--runs", *runs] if runs else []), *([] if "bench_comm" in left_out else ["--no-comm"])]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, choices=list(RUNS))
    ap.add_argument("--model", default="hybrid_1b")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    ap.add_argument("--micro", type=int, default=4, help="micro-batch (sequences per GPU per forward)")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--gpus", type=int, default=2, help="GPUs of the multi-GPU runs")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per run")
    ap.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for the whole invocation: no run starts after it and a run is stopped at it; the runs "
        "left out are printed as the command that runs them (rows are merged into --out as each run ends)",
    )
    ap.add_argument("--no-comm", action="store_true", help="skip bench_comm.py")
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="profile 2 more steps of each run after its timed ones (train.profile_start): print rank 0's "
        "summary (wall vs GPU kernel time per step, time by kind of kernel) and keep it and the rank traces in DIR",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="run directories (default: a temporary one in /dev/shm when present: the final "
        "checkpoint of a 1B model is 16 GB); removed after each run",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/bench/distributed.json")
    ap.add_argument("--comm-out", type=Path, default=REPO / "docs/results/bench/comm.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))  # run as a script: the package of this checkout
    from nvfp4train.launch.processes import run_and_kill_on_timeout  # a timed-out run ends with its workers

    shm = Path("/dev/shm")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_distributed_", dir=shm if shm.is_dir() else None))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows, left_out, started = [], [], time.perf_counter()
    earlier = earlier_baselines(args)
    for name in args.runs:
        remaining = None if args.deadline is None else args.deadline - (time.perf_counter() - started)
        if remaining is not None and remaining <= 0:
            left_out.append(name)
            continue
        skip = unavailable(name)
        if skip:
            print(f"[{time.perf_counter() - started:5.0f}s] {name}: skipped: {skip}", flush=True)
            rows.append({"run": name, "gpus": RUNS[name][0], "error": f"skipped: {skip}", "seconds": 0.0})
            continue
        out_dir = work / name
        shutil.rmtree(out_dir, ignore_errors=True)
        cmd = command(name, out_dir, args)
        print(f"[{time.perf_counter() - started:5.0f}s] {name}: {' '.join(cmd[1:])}", flush=True)
        timeout = args.timeout if remaining is None else min(args.timeout, remaining)
        t0 = time.perf_counter()
        try:
            proc = run_and_kill_on_timeout(cmd, timeout, cwd=REPO, env=env)
            failed = proc.returncode != 0
            why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1][:200] if failed else ""
        except subprocess.TimeoutExpired:
            cut = "at --deadline" if timeout < args.timeout else ""
            failed, why = True, f"timed out after {timeout:.0f} s {cut}".strip()
        seconds = time.perf_counter() - t0
        if failed:
            row = {"run": name, "gpus": RUNS[name][0], "error": why, "seconds": seconds}
            print(f"    failed: {why}", flush=True)
        else:
            row = {
                **summarize(name, out_dir, args),
                "command": " ".join(["python", *cmd[1:]]).replace(str(out_dir), "OUT"),
                "seconds": seconds,
                # dynamo gave up compiling some frame (they then run eager): the row is not of the compiled step
                "hit_recompile_limit": "recompile_limit" in proc.stderr,
            }
            if row["hit_recompile_limit"]:
                print("    warning: dynamo hit its recompile limit; some frames ran eager", flush=True)
            print(
                f"    {row['tokens_per_s'] / 1e3:.1f}k tokens/s, peak {row['peak_gib']} GiB, "
                f"loss {row['final_loss']} ({seconds:.0f} s)",
                flush=True,
            )
        rows.append(row)
        if args.profile is not None and (out_dir / "profile" / "summary.txt").is_file():
            args.profile.mkdir(parents=True, exist_ok=True)
            for f in (out_dir / "profile").iterdir():
                shutil.copy(f, args.profile / f"{name}_{f.name}")
            print((out_dir / "profile" / "summary.txt").read_text(), flush=True)
            for other in sorted((out_dir / "profile").glob("summary_rank*.txt")):  # the others' timelines beside
                lines = other.read_text().splitlines()
                head = lines[1 : next((i for i, x in enumerate(lines) if x.startswith("    profiled")), len(lines))]
                print(f"  {other.stem.removeprefix('summary_')}:\n" + "\n".join(head), flush=True)
        shutil.rmtree(out_dir, ignore_errors=True)
        if not failed:  # stored now: an invocation stopped later keeps the rows of the runs that ended
            merge_rows(args.out, finished_rows(rows, earlier)[-1:])  # this run's row, the last finished
    done = finished_rows(rows, earlier)
    if done:
        merge_rows(args.out, done)
    if not args.no_comm and args.deadline is not None and time.perf_counter() - started >= args.deadline:
        left_out.append("bench_comm")
    elif not args.no_comm:
        comm = [
            sys.executable,
            "-m",
            "nvfp4train.launch",
            "--standalone",
            f"--nproc_per_node={args.gpus}",
            str(REPO / "benchmarks/bench_comm.py"),
            "--model",
            args.model,
            "--device",
            args.device,
            "--json",
            str(args.comm_out),
        ]
        print(f"[{time.perf_counter() - started:5.0f}s] bench_comm: {' '.join(comm[1:])}", flush=True)
        elapsed = time.perf_counter() - started
        timeout = args.timeout if args.deadline is None else min(args.timeout, args.deadline - elapsed)
        try:
            proc = run_and_kill_on_timeout(comm, timeout, cwd=REPO, env=env)
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(comm, 1, "", f"timed out after {timeout:.0f} s")
        print(proc.stdout if proc.returncode == 0 else f"    failed: {proc.stderr.strip()[-400:]}")
    print_table(rows, earlier)
    print(f"{len(done)} rows merged into {args.out}; total {time.perf_counter() - started:.0f} s")
    if left_out:
        print(f"not started by --deadline {args.deadline:.0f} s: {' '.join(left_out)}; to run them:")
        print("    " + " ".join(["python", "benchmarks/bench_distributed.py", *rest_of(argv, left_out)]))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
