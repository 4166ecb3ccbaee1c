"""How long a training run takes to start: from `python -m nvfp4train.train` to its first step's record, with
fresh kernel caches (a machine's first run of these shapes) and warm ones (every run after it), and where the
warm start-up's host time goes.

    python -m benchmarks.bench_startup                                    # hybrid_5m NVFP4, deterministic
    python -m benchmarks.bench_startup --set precision=bf16 train.deterministic=false --trials fresh warm
    python -m benchmarks.bench_startup --cprofile 25                       # + the top 25 functions, warm

Each trial is its own process, as the reproduction's executor runs them: `fresh` points Triton's and
Inductor's caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR) at an empty directory, `warm` at the one the
trial before it filled. `worker` trains the same run twice in one worker process (`python -m
nvfp4train.train.worker`, what `reproduce run --runs-per-process` starts) and times the second, from its
request to its first step. The run trains --steps steps on the bundled corpus and evaluates nothing in between.
Columns: launch_to_first_step_s (wall clock, the launch to the first metrics record: the user's wait),
trainer_to_first_step_s (the trainer's own time_to_first_step_s: build, compile, capture, autotuning),
imports_s (the difference: interpreter, imports, config), run_s (the whole process). Rows merge into --out:
    {model, precision, deterministic, seq, batch, trial, launch_to_first_step_s, trainer_to_first_step_s,
     imports_s, run_s, cprofile, gpu, commit}   (cprofile: that trial ran under cProfile, which slows its host side)
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEY = ("model", "precision", "deterministic", "seq", "batch", "trial", "cprofile", "gpu")
DEFAULT_SET = (
    "model=hybrid_5m",
    "precision=nvfp4",
    "train.seq_len=1024",
    "train.global_batch_size=32",
    "train.deterministic=true",
)


def _value(overrides: list[str], key: str, default: str) -> str:
    for o in reversed(overrides):
        if o.split("=", 1)[0] == key:
            return o.split("=", 1)[1]
    return default


def one_trial(overrides: list[str], steps: int, cache: Path, out_dir: Path, profile: Path | None) -> dict:
    """Launch one run and time it; the first metrics record with a step marks its first step."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache / "triton"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"))
    env.setdefault("WANDB_MODE", "disabled")
    prefix = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
    cmd = prefix + ["-m", "nvfp4train.train", *overrides, f"train.max_steps={steps}", f"train.eval_every={10 * steps}",
                    "train.eval_sequences=0", "train.progress=false", f"out_dir={out_dir}"]  # fmt: skip
    metrics = out_dir / "metrics.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and '"step"' in metrics.read_text():
            first = time.perf_counter() - t0
        time.sleep(0.05)
    run_s = time.perf_counter() - t0
    log = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        sys.exit(f"the run failed (exit {proc.returncode}):\n{log[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trainer = next((r["time_to_first_step_s"] for r in records if "time_to_first_step_s" in r), None)
    if first is None:
        first = run_s
    return {
        "launch_to_first_step_s": round(first, 1),
        "trainer_to_first_step_s": None if trainer is None else round(trainer, 1),
        "imports_s": None if trainer is None else round(first - trainer, 1),
        "run_s": round(run_s, 1),
    }


def worker_trial(overrides: list[str], steps: int, cache: Path, tmp: Path) -> dict:
    """Two runs in one worker process (the executor's TrainWorker); the second one timed as one_trial times a
    process of its own."""
    import threading

    from nvfp4train.reproduce.executors import TrainWorker

    os.environ.update(TRITON_CACHE_DIR=str(cache / "triton"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"))
    os.environ.setdefault("WANDB_MODE", "disabled")
    worker = TrainWorker(gpus=None, runs_at_once=1, runs=2)
    try:
        for k in range(2):
            out_dir, console, rc = tmp / f"worker{k}", tmp / f"worker{k}.log", []
            args = [*overrides, f"train.max_steps={steps}", f"train.eval_every={10 * steps}", "train.eval_sequences=0",
                    "train.progress=false", f"out_dir={out_dir}"]  # fmt: skip
            metrics = out_dir / "metrics.jsonl"
            t0 = time.perf_counter()
            training = threading.Thread(target=lambda: rc.append(worker.train(args, console)), daemon=True)
            training.start()
            first = None
            while training.is_alive():
                if first is None and metrics.exists() and '"step"' in metrics.read_text():
                    first = time.perf_counter() - t0
                time.sleep(0.05)
            run_s = time.perf_counter() - t0
            if rc != [0]:
                log = console.read_text() if console.exists() else ""
                sys.exit(f"the run in the worker failed (exit {rc[0] if rc else '?'}):\n{log[-3000:]}")
    finally:
        worker.close()
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trainer = next((r["time_to_first_step_s"] for r in records if "time_to_first_step_s" in r), None)
    first = run_s if first is None else first
    return {
        "launch_to_first_step_s": round(first, 1),
        "trainer_to_first_step_s": None if trainer is None else round(trainer, 1),
        "imports_s": None if trainer is None else round(first - trainer, 1),
        "run_s": round(run_s, 1),
    }


def merge_rows(path: Path, rows: list[dict]) -> None:
    existing = json.loads(path.read_text()) if path.exists() else []
    merged = {tuple(r.get(k) for k in KEY): r for r in existing}
    merged.update({tuple(r.get(k) for k in KEY): r for r in rows})
    path.write_text(json.dumps(sorted(merged.values(), key=lambda r: [str(r.get(k)) for k in KEY]), indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", nargs="*", default=[], help="trainer overrides on top of " + " ".join(DEFAULT_SET))
    ap.add_argument("--trials", nargs="+", default=["fresh", "warm"], choices=["fresh", "warm", "worker"])
    ap.add_argument("--steps", type=int, default=20, help="steps per run")
    ap.add_argument("--cache", type=Path, help="cache directory for the trials (default: a new temporary one)")
    ap.add_argument("--cprofile", type=int, metavar="N", help="profile the last trial: print its N slowest functions")
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/bench/startup.json")
    args = ap.parse_args()

    import torch

    from nvfp4train.data.paths import git_commit

    overrides = [*DEFAULT_SET, *args.set]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    base = {
        "model": _value(overrides, "model", "?"),
        "precision": _value(overrides, "precision", "?"),
        "deterministic": _value(overrides, "train.deterministic", "false") == "true",
        "seq": int(_value(overrides, "train.seq_len", "0")),
        "batch": int(_value(overrides, "train.global_batch_size", "0")),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or Path(tmp) / "cache"
        for i, trial in enumerate(args.trials):
            if trial == "fresh" and any(cache.glob("*")):
                cache = Path(tmp) / f"cache{i}"  # an empty one
            profile = Path(tmp) / "startup.prof" if args.cprofile and i == len(args.trials) - 1 else None
            if trial == "worker":
                profile = None  # not under cProfile: the worker is a process of its own
                (Path(tmp) / f"run{i}").mkdir()
                timing = worker_trial(overrides, args.steps, cache, Path(tmp) / f"run{i}")
            else:
                timing = one_trial(overrides, args.steps, cache, Path(tmp) / f"run{i}", profile)
            row = {**base, "trial": trial, **timing, "cprofile": profile is not None}  # cProfile slows the host
            rows.append({**row, "gpu": gpu, "commit": git_commit(short=True)})
            print(f"{trial:6s} {timing}", flush=True)
            merge_rows(args.out, rows)
        if args.cprofile:
            stats = pstats.Stats(str(profile))
            stats.sort_stats("cumulative").print_stats("nvfp4train", args.cprofile)  # our calls, inclusive
            stats.sort_stats("tottime").print_stats(args.cprofile)  # anyone's, exclusive
    print(f"\n{'trial':6s} {'launch→step1 s':>15s} {'trainer s':>10s} {'imports s':>10s} {'run s':>7s}")
    for r in rows:
        print(f"{r['trial']:6s} {r['launch_to_first_step_s']:15.1f} {r['trainer_to_first_step_s'] or 0:10.1f} "
              f"{r['imports_s'] or 0:10.1f} {r['run_s']:7.1f}")  # fmt: skip
    print(f"({base['model']} {base['precision']} deterministic={base['deterministic']}, {gpu}, {rows[0]['commit']})")


if __name__ == "__main__":
    main()
