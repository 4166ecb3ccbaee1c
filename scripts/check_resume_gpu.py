"""Exact resume on GPUs, measured: kill -9 after a checkpoint, resume, compare per-step losses.

For each arm the same command runs twice into two directories: once uninterrupted, once killed with
SIGKILL as soon as the checkpoint at `--kill-at` is complete, then resumed (train.resume=auto). The
table gives, per arm, how many of the resumed steps repeat the uninterrupted run's loss bit for bit
and the largest difference. DeepSpeed arms are also compared against the PyTorch engine's run.

    python scripts/check_resume_gpu.py --arms single ddp fsdp2 ds1 ds2 --out /tmp/resume
    (on a machine with 2 GPUs for the multi-GPU arms; prints a table last, writes resume_gpu.json)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = {  # name: (processes, overrides)
    "single": (1, ["train.parallel=ddp"]),
    "ddp": (2, ["train.parallel=ddp"]),
    "fsdp2": (2, ["train.parallel=fsdp2"]),
    "ds1": (2, ["train.parallel=deepspeed", "train.zero_stage=1"]),
    "ds2": (2, ["train.parallel=deepspeed", "train.zero_stage=2"]),
}


def command(nproc: int, out: Path, common: list[str], extra: list[str]) -> list[str]:
    launcher = (
        [sys.executable, "-m", "nvfp4train.train"]
        if nproc == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "nvfp4train.train",
        ]
    )
    return [*launcher, f"out_dir={out}", *common, *extra]


def losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if r.get("loss") is not None}


def run(cmd: list[str], log: Path) -> float:
    t0 = time.time()
    with open(log, "a") as f:
        subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=True)
    return time.time() - t0


def run_killed(cmd: list[str], marker: Path, log: Path) -> None:
    """Start `cmd`, SIGKILL it and all its processes once `marker` exists. The workers too: torchrun starts
    each in a session of its own, so killpg of the launcher left them training to the end (and the "resume"
    that followed had nothing to do)."""
    sys.path.insert(0, str(ROOT))
    from nvfp4train.launch.processes import kill_tree

    with open(log, "a") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        while not marker.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd} ended before {marker} appeared; see {log}")
            time.sleep(0.02)
        kill_tree(proc)


def run_resumed(cmd: list[str], log: Path) -> int:
    """Run `cmd` again; the step it resumed from (its banner says), or RuntimeError if it did not resume."""
    start = log.stat().st_size
    run(cmd, log)
    found = re.search(r"resumed from \S*step_(\d+)", log.read_text()[start:])
    if not found:
        raise RuntimeError(f"{cmd} did not resume from a checkpoint; see {log}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--model", default="hybrid_125m")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kill-at", type=int, default=10)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cpu runs the same check with gloo (for trying the script)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/resume_gpu"))
    args = ap.parse_args()
    common = [
        f"model={args.model}",
        f"precision={args.precision}",
        f"train.max_steps={args.steps}",
        f"train.save_every={args.kill_at}",
        "train.log_every=1",
        "train.progress=false",
        f"train.seq_len={args.seq}",
        f"train.global_batch_size={args.batch}",
        "train.eval_sequences=4",
        f"train.device={args.device}",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for arm in args.arms:
        nproc, extra = ARMS[arm]
        ref, cut, log = args.out / arm / "ref", args.out / arm / "cut", args.out / f"{arm}.log"
        extra = extra + [f"train.micro_batch_size={args.batch // nproc}"]
        seconds = run(command(nproc, ref, common, extra), log)
        run_killed(
            command(nproc, cut, common, extra), cut / "checkpoints" / f"step_{args.kill_at:08d}" / "meta.json", log
        )
        killed_at = max(losses(cut))
        resumed_from = run_resumed(command(nproc, cut, common, extra), log)
        a, b = losses(ref), losses(cut)
        resumed = [s for s in sorted(a) if s > resumed_from]
        before = [s for s in sorted(a) if s <= resumed_from]  # both runs uninterrupted: run-to-run noise
        diffs = [abs(a[s] - b[s]) for s in resumed]
        row = {
            "arm": arm,
            "gpus": nproc,
            "steps": args.steps,
            "killed_after_step": killed_at,
            "resumed_from": resumed_from,
            "resumed_steps": len(resumed),
            "bitwise_equal": sum(a[s] == b[s] for s in resumed),
            "max_abs_diff": max(diffs),
            "before_kill_bitwise_equal": f"{sum(a[s] == b[s] for s in before)}/{len(before)}",
            "before_kill_max_abs_diff": max(abs(a[s] - b[s]) for s in before),
            "max_rel_diff": max(d / abs(a[s]) for d, s in zip(diffs, resumed)),
            "ref_seconds": round(seconds, 1),
            "final_loss": a[max(a)],
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    torch_ref = next((r for r in results if r["arm"] == "ddp"), None)
    for r in results:
        if r["arm"].startswith("ds") and torch_ref:
            a, b = losses(args.out / "ddp" / "ref"), losses(args.out / r["arm"] / "ref")
            r["vs_torch_engine_max_rel_diff"] = max(abs(a[s] - b[s]) / abs(a[s]) for s in a if s in b)
    (args.out / "resume_gpu.json").write_text(json.dumps(results, indent=1))
    print(
        "\n| arm | GPUs | killed after | resumed from | resumed steps | bitwise equal | max abs diff | "
        "max rel diff | before the kill: equal, max abs diff | vs torch engine | final loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        vs = r.get("vs_torch_engine_max_rel_diff")
        print(
            f"| {r['arm']} | {r['gpus']} | {r['killed_after_step']} | {r['resumed_from']} | {r['resumed_steps']} | "
            f"{r['bitwise_equal']} | {r['max_abs_diff']:.3g} | {r['max_rel_diff']:.3g} | "
            f"{r['before_kill_bitwise_equal']}, {r['before_kill_max_abs_diff']:.3g} | "
            f"{'' if vs is None else f'{vs:.3g}'} | {r['final_loss']:.4f} |"
        )


if __name__ == "__main__":
    main()
