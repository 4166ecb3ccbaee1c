"""Deterministic training on GPUs, measured: the same command twice, compared step by step, and what it costs.

Each pair case runs one command twice at once, run A on GPU 0 and run B on GPU 1 (same GPU model, so their
bits are comparable), each deterministic process with its own fresh Triton and Inductor caches (so that
neither reuses the other's autotuning), and compares the loss and gradient norm of every step bit for bit.
First the timed pairs run one case at a time: BF16 and NVFP4 compiled with the CUDA graph, with the flag.
Then the untimed cases run side by side: the eager pairs; DDP on both GPUs (eager unless --ddp-compile; the
command twice, one after the other); and the resume case, which kills a run with SIGKILL as soon as its
checkpoint at --kill-at is complete, resumes it (train.resume=auto) and compares the resumed steps with
the uninterrupted run A of the BF16 graph case (every case runs with the caller's
NVFP4TRAIN_DETERMINISTIC_ATTENTION and NVFP4TRAIN_FILL_UNINITIALIZED, or the trainer's defaults). Last the
same compiled pairs without the flag, timed alone: the baseline of the cost column (which also shows that
those runs differ), and between them the BF16 pair with the flag and math SDPA in place of FlexAttention
(NVFP4TRAIN_DETERMINISTIC_ATTENTION=math).
`--cases cost_1b` adds hybrid_1b with and without the flag (tokens/s only), alone on GPU 0 at the end.

    python scripts/check_determinism_gpu.py                       # the default cases, hybrid_repro seq 1024 x 32
    python scripts/check_determinism_gpu.py --steps 100 --eager-steps 30 --cases graph eager resume
    python scripts/check_determinism_gpu.py --device cpu --steps 3 --model hybrid_tiny --seq 64 --batch 4
        (tries the script on a CPU machine, without compiling)

Prints one table last and writes determinism.json under --out. A case that fails or runs out of time is a
row saying so; cases that would start after --deadline seconds are skipped, so that the table always comes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("graph", "eager", "baseline", "ddp", "resume", "math", "cost_1b")
DEFAULT_CASES = ("graph", "eager", "baseline", "ddp", "resume", "math")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it (torchrun gives each rank a session of its own)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the repository's package, also where it is not installed
    from nvfp4train.launch.processes import kill_tree as kill_all

    kill_all(proc)


class Clock:
    def __init__(self, deadline: float):
        self.t0, self.deadline = time.time(), deadline

    def left(self) -> float:
        return self.deadline - (time.time() - self.t0)


def train_cmd(nproc: int, overrides: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "nvfp4train.train", *overrides]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "nvfp4train.train",
        *overrides,
    ]


def env_for(gpus: str, cache: Path | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if cache is not None:  # a process's own kernel caches: no autotuning result shared with the other run
        env["TRITON_CACHE_DIR"], env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "triton"), str(cache / "inductor")
    return env


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    f = open(log, "a")  # noqa: SIM115  (the child writes it until it ends)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def finish(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Wait for the processes; kill (SIGKILL, with every process under them) what is still running at the limit."""
    end = time.time() + max(timeout, 1)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(end - time.time(), 0.1)))
        except subprocess.TimeoutExpired:
            kill_tree(p)
            codes.append(124)
    return codes


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def steps_of(out: Path) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records(out) if r.get("loss") is not None}


def final_val(out: Path) -> float | None:
    vals = [r["val/mean"] for r in records(out) if "val/mean" in r]
    return vals[-1] if vals else None


def tokens_per_s(out: Path) -> float | None:
    """The median step's tokens/s over the second half of the run (compilation and warm-up left out)."""
    rows = [r for r in records(out) if r.get("tokens_per_s") is not None]
    if not rows:
        return None
    last = rows[-1]["step"]
    late = [r["tokens_per_s"] for r in rows if r["step"] > last // 2] or [rows[-1]["tokens_per_s"]]
    return statistics.median(late)


def compare(a: Path, b: Path, after: int = 0) -> dict:
    """First step (> after) whose loss or gradient norm differs, the largest |loss difference|, and how many
    steps were compared; the final validation losses compared too."""
    sa, sb = steps_of(a), steps_of(b)
    steps = sorted(s for s in sa if s > after)
    missing = [s for s in steps if s not in sb]
    differing = [s for s in steps if s in sb and sa[s] != sb[s]]
    first = min(differing + missing) if differing or missing else None
    diffs = [abs(sa[s][0] - sb[s][0]) for s in steps if s in sb]
    va, vb = final_val(a), final_val(b)
    return {
        "compared": len([s for s in steps if s in sb]),
        "first_diff": first,
        "max_abs_dloss": max(diffs) if diffs else None,
        "val_equal": va is not None and va == vb,
        "val": [va, vb],
    }


def overrides_for(
    args,
    out: Path,
    precision: str,
    deterministic: bool,
    compiled: bool,
    steps: int,
    model: str | None = None,
    seq: int | None = None,
    batch: int | None = None,
    micro: int | None = None,
    log_every: int = 1,
) -> list[str]:
    o = [
        f"out_dir={out}",
        f"model={model or args.model}",
        f"precision={precision}",
        f"train.seq_len={seq or args.seq}",
        f"train.global_batch_size={batch or args.batch}",
        f"train.max_steps={steps}",
        f"train.log_every={log_every}",
        "train.progress=false",
        f"train.eval_sequences={args.eval_sequences}",
        f"train.deterministic={str(deterministic).lower()}",
        # on CPU (trying the script) nothing compiles: Inductor takes minutes there
        f"train.compile={str(compiled and args.device == 'cuda').lower()}",
        f"train.cuda_graph={'auto' if compiled else 'false'}",
        f"train.device={args.device}",
        f"seed={args.seed}",
        f"model.ssd_backend={args.ssd_backend}",
    ]
    if args.kill_at and steps > args.kill_at:
        o.append(f"train.save_every={args.kill_at}")  # the same in every run, so the resume case's config matches
    if micro:
        o.append(f"train.micro_batch_size={micro}")
    return o


def note_failure(row: dict, case: Path, codes: list[int]) -> None:
    """A crashed run compares nothing: say so in the row, with the end of its log (main then exits 1)."""
    for run, code in zip("AB", codes):
        if code:
            tail = (case / f"{run}.log").read_text(errors="replace").strip().splitlines()[-5:]
            row["note"] = f"failed: run {run} exited {code}: " + " | ".join(tail)
            return


def run_pair(
    args,
    clock: Clock,
    name: str,
    precision: str,
    deterministic: bool,
    compiled: bool,
    steps: int,
    attention: str | None = None,
) -> dict:
    """Run A on GPU 0 and run B on GPU 1 at once (one after the other on CPU), each with its own caches."""
    case = args.out / name
    row = {
        "case": name,
        "gpus": "1+1" if args.parallel else "1",
        "precision": precision,
        "deterministic": deterministic,
        "compiled": compiled,
        "steps": steps,
    }
    procs = []
    for run, gpu in (("A", "0"), ("B", "1" if args.parallel else "0")):
        cache = case / f"cache_{run}" if deterministic else None  # the non-deterministic baseline keeps the shared one
        cmd = train_cmd(1, overrides_for(args, case / run, precision, deterministic, compiled, steps))
        env = env_for(gpu if args.device == "cuda" else "", cache)
        if attention:  # else the caller's environment (or the trainer's default), as the resume case runs with
            env["NVFP4TRAIN_DETERMINISTIC_ATTENTION"] = attention
        proc = start(cmd, env, case / f"{run}.log")
        if not args.parallel:  # one GPU (or the CPU): one run after the other
            finish([proc], clock.left())
        procs.append(proc)
    codes = finish(procs, clock.left())
    row["exit"] = codes
    row.update(compare(case / "A", case / "B"))
    row["tokens_per_s"] = tokens_per_s(case / "A")
    note_failure(row, case, codes)
    return row


def run_ddp(args, clock: Clock) -> dict:
    case = args.out / f"ddp_bf16_{'compiled' if args.ddp_compile else 'eager'}_det"
    row = {
        "case": case.name,
        "gpus": "2 (DDP)",
        "precision": "bf16",
        "deterministic": True,
        "compiled": args.ddp_compile,
        "steps": args.ddp_steps,
    }
    codes = []
    for run in ("A", "B"):
        cmd = train_cmd(
            2, overrides_for(args, case / run, "bf16", True, args.ddp_compile, args.ddp_steps, micro=args.batch // 2)
        )
        codes += finish(
            [start(cmd, env_for("0,1" if args.device == "cuda" else "", case / f"cache_{run}"), case / f"{run}.log")],
            clock.left(),
        )
    row["exit"] = codes
    row.update(compare(case / "A", case / "B"))
    row["tokens_per_s"] = tokens_per_s(case / "A")
    note_failure(row, case, codes)
    return row


def run_resume(args, clock: Clock, reference: Path) -> dict:
    """The first pair case's run, killed with SIGKILL after its checkpoint at --kill-at and resumed, against
    that case's uninterrupted run A. Runs on GPU 0 with run B's caches (not A's)."""
    case = args.out / "resume_bf16_graph_det"
    row = {
        "case": case.name,
        "gpus": "1",
        "precision": "bf16",
        "deterministic": True,
        "compiled": True,
        "steps": args.steps,
    }
    env = env_for("0" if args.device == "cuda" else "", reference.parent / "cache_B")
    cmd = train_cmd(1, overrides_for(args, case / "cut", "bf16", True, True, args.steps))
    marker = case / "cut" / "checkpoints" / f"step_{args.kill_at:08d}" / "meta.json"
    proc = start(cmd, env, case / "cut.log")
    while not marker.exists() and proc.poll() is None and clock.left() > 0:
        time.sleep(0.05)
    if proc.poll() is None:
        kill_tree(proc)
    killed_after = max(steps_of(case / "cut"), default=0)
    codes = [proc.returncode]
    if marker.exists():
        codes += finish([start(cmd, env, case / "cut.log")], clock.left())
    row["exit"] = codes
    row["killed_after_step"] = killed_after
    row.update(compare(reference, case / "cut", after=args.kill_at))
    row["tokens_per_s"] = None
    return row


def run_cost_1b(args, clock: Clock) -> list[dict]:
    """hybrid_1b, compiled with the CUDA graph, BF16: tokens/s with and without the flag (GPU 0, one run at a time)."""
    rows = []
    for det in (True, False):
        case = args.out / f"cost_hybrid_1b_bf16_{'det' if det else 'nondet'}"
        cmd = train_cmd(
            1,
            overrides_for(
                args,
                case / "A",
                "bf16",
                det,
                True,
                args.steps_1b,
                model="hybrid_1b",
                seq=args.seq_1b,
                batch=args.batch_1b,
                micro=args.micro_1b,
                log_every=5,
            ),
        )
        codes = finish([start(cmd, env_for("0" if args.device == "cuda" else "", None), case / "A.log")], clock.left())
        rows.append(
            {
                "case": case.name,
                "gpus": "1",
                "precision": "bf16",
                "deterministic": det,
                "compiled": True,
                "steps": args.steps_1b,
                "exit": codes,
                "tokens_per_s": tokens_per_s(case / "A"),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    by_case = {r["case"]: r for r in rows}
    baseline_of = {f"{p}_graph_det": f"{p}_graph_nondet" for p in ("bf16", "nvfp4")}
    baseline_of["bf16_graph_det_math"] = "bf16_graph_nondet"
    baseline_of["cost_hybrid_1b_bf16_det"] = "cost_hybrid_1b_bf16_nondet"
    header = (
        "| case | GPUs | steps compared | first differing step | max abs dloss | final val A = B | "
        "tokens/s | non-det tokens/s | cost | exit |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = by_case.get(baseline_of.get(r["case"], ""), {}).get("tokens_per_s")
        tps = r.get("tokens_per_s")
        cost = f"{(base - tps) / base:+.1%}" if base and tps else ""
        first = ("none" if r["first_diff"] is None else r["first_diff"]) if "compared" in r else ""
        dl = r.get("max_abs_dloss")
        lines.append(
            f"| {r['case']} | {r['gpus']} | {r.get('compared', '')} | {first} | "
            f"{'' if dl is None else f'{dl:.3g}'} | {r.get('val_equal', '')} | "
            f"{'' if tps is None else f'{tps:,.0f}'} | {'' if not base else f'{base:,.0f}'} | {cost} | "
            f"{r.get('exit', r.get('note', ''))} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cases",
        nargs="+",
        default=list(DEFAULT_CASES),
        choices=CASES,
        help="graph: BF16 and NVFP4 compiled with the CUDA graph; eager: both eager; baseline: "
        "both compiled without the flag (the cost's reference); ddp; resume (needs graph); "
        "math: BF16 compiled "
        "with math SDPA instead of FlexAttention; cost_1b (hybrid_1b "
        "with and without the flag: not in the default set)",
    )
    ap.add_argument("--model", default="hybrid_repro")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=300, help="steps of the compiled pairs and the resume case")
    ap.add_argument("--eager-steps", type=int, default=100)
    ap.add_argument("--ddp-steps", type=int, default=100)
    ap.add_argument(
        "--ddp-compile",
        action="store_true",
        help="compile the DDP runs (eager by default: each of the two runs one after the other would compile)",
    )
    ap.add_argument("--kill-at", type=int, default=50, help="the resume case's checkpoint (train.save_every)")
    ap.add_argument("--steps-1b", type=int, default=30)
    ap.add_argument("--seq-1b", type=int, default=4096)
    ap.add_argument("--batch-1b", type=int, default=8)
    ap.add_argument("--micro-1b", type=int, default=4)
    ap.add_argument(
        "--ssd-backend",
        default="auto",
        choices=("auto", "torch", "triton"),
        help="model.ssd_backend of every run (torch: the chunked PyTorch scan, compiled with the model)",
    )
    ap.add_argument("--eval-sequences", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--deadline",
        type=float,
        default=420,
        help="seconds: no case starts after this, and running ones are killed at it",
    )
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", type=Path, default=Path(f"/tmp/determinism_check-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = ap.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: --out {args.out} is not empty: give a new directory", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    n_gpus = 0
    if args.device == "cuda":
        import torch

        n_gpus = torch.cuda.device_count()
        if n_gpus == 0:
            print("error: --device cuda: no CUDA GPU is visible (use --device cpu to try the script)", file=sys.stderr)
            return 2
        names = {torch.cuda.get_device_name(i) for i in range(min(n_gpus, 2))}
        if len(names) > 1:
            print(
                f"error: GPUs 0 and 1 are different models ({', '.join(sorted(names))}): their bits are not "
                "comparable; set CUDA_VISIBLE_DEVICES to two of one model",
                file=sys.stderr,
            )
            return 2
    args.parallel = n_gpus >= 2
    if not args.parallel and "ddp" in args.cases:
        args.cases = [c for c in args.cases if c != "ddp"]
        print("one GPU: the DDP case is left out", flush=True)
    clock, rows = Clock(args.deadline), []

    def due(name: str) -> bool:
        if clock.left() > 0:
            return True
        rows.append(
            {
                "case": name,
                "gpus": "",
                "precision": "",
                "deterministic": False,
                "compiled": False,
                "note": "skipped: past --deadline",
            }
        )
        return False

    # 1. the timed pairs, one case at a time (the cost column compares their tokens/s)
    def timed_pairs(pairs):
        for name, precision, det, *attention in pairs:
            if due(name):
                rows.append(run_pair(args, clock, name, precision, det, True, args.steps, *attention))
                print(json.dumps(rows[-1]), flush=True)

    if "graph" in args.cases:
        timed_pairs([("bf16_graph_det", "bf16", True), ("nvfp4_graph_det", "nvfp4", True)])
    # 2. the untimed cases side by side: the eager pairs, DDP (both GPUs), the resume (GPU 0); then hybrid_1b
    jobs = []
    if "eager" in args.cases:
        for precision in ("bf16", "nvfp4"):
            name = f"{precision}_eager_det"
            jobs.append(
                (name, lambda p=precision, n=name: [run_pair(args, clock, n, p, True, False, args.eager_steps)])
            )
    if "ddp" in args.cases:
        jobs.append(("ddp_bf16_det", lambda: [run_ddp(args, clock)]))
    if "resume" in args.cases:
        reference = args.out / "bf16_graph_det" / "A"
        skipped = {
            "case": "resume_bf16_graph_det",
            "gpus": "1",
            "precision": "bf16",
            "deterministic": True,
            "compiled": True,
            "note": "skipped: needs the graph case's run A",
        }
        jobs.append(
            ("resume_bf16_graph_det", lambda: [run_resume(args, clock, reference) if reference.is_dir() else skipped])
        )
    jobs = [(name, job) for name, job in jobs if due(name)]
    first_untimed = len(rows)
    if args.parallel:
        import threading

        results: dict[str, list] = {}
        threads = [threading.Thread(target=lambda n=name, j=job: results.__setitem__(n, j())) for name, job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, _ in jobs:
            rows += results.get(
                name,
                [
                    {
                        "case": name,
                        "gpus": "",
                        "precision": "",
                        "deterministic": False,
                        "compiled": False,
                        "note": "failed: see its log",
                    }
                ],
            )
    else:
        for _, job in jobs:
            rows += job()
    for row in rows[first_untimed:]:
        print(json.dumps(row), flush=True)
    # 3. the baseline pairs without the flag (timed: the cost column), last so that a short --deadline loses
    #    only the cost; then hybrid_1b
    if "baseline" in args.cases:
        timed_pairs([("bf16_graph_nondet", "bf16", False)])
    if "math" in args.cases:  # the compiled model's attention as math SDPA instead of FlexAttention
        timed_pairs([("bf16_graph_det_math", "bf16", True, "math")])
    if "baseline" in args.cases:
        timed_pairs([("nvfp4_graph_nondet", "nvfp4", False)])
    if "cost_1b" in args.cases and due("cost_hybrid_1b"):
        rows += run_cost_1b(args, clock)
    (args.out / "determinism.json").write_text(json.dumps(rows, indent=1))
    print(f"\nlogs and runs under {args.out}\n")
    print(table(rows))
    failed = [r for r in rows if str(r.get("note", "")).startswith("failed")]
    for r in failed:
        print(f"{r['case']}: {r['note']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
