"""`python -m nvfp4train.reproduce VERB`: the scaled-down reproduction of "Pretraining LLMs with NVFP4"
(arXiv 2509.25149) on your GPU node or SLURM cluster.

    plan EXPERIMENT                      every run (arm x seed): its training and evaluation commands, out_dir
    run EXPERIMENT... --executor local   run them on this machine's GPUs (one run per GPU; --gpus-per-run N
                   [--gpus 0,1]          with torchrun), queueing the rest seed by seed (every arm of every
                                         experiment named for seed 1, then seed 2, ...); skips finished runs,
                                         resumes interrupted ones; without CUDA, one at a time on the CPU;
                   [--runs-per-process N]  N one-GPU runs one after the other in one process per GPU
    run EXPERIMENT... --executor slurm   one job array per experiment over arm x seed
                   [--dry-run]           (slurm/reproduce_array.sbatch); --dry-run renders without submitting
    status [EXPERIMENT...]               a table of every run's progress
    copy-results EXPERIMENT... [--to D]  copy finished runs' results (config, metrics gzipped, eval, run.json;
                                         no checkpoints) to docs/results/runs/, to commit them
    report                               docs/results/reproduction.md (+ figures) from the finished runs
    tune-lr SWEEP [--factors 0.5,1,2]    a sweep's per-size lr, tuned on BF16: BF16 runs of its baseline at
            [--report]                   each size's lr x each factor (run's local executor), then a table per
                                         size with the best lr and the lines to write into the file
    predict model=M tokens=D precision=P the gap a sweep's fitted law predicts at M (a preset or N) and D
            [--extrapolate]              tokens, with its interval; past 0.5 decade outside the sweep only
                                         with --extrapolate

Experiments are configs/reproduce/<name>.yaml (experiments.py describes the keys). Runs live in
runs/repro/<experiment>/<arm>/seed<k>/ (--runs-dir): the trainer's out_dir, plus console.log (the
commands' output), eval.json (BF16 evaluation of the final checkpoint) and run.json (commit, GPU, torch,
deterministic flag, wall time, exit codes).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from nvfp4train.reproduce import tune_lr
from nvfp4train.reproduce.experiments import (
    EXPERIMENTS_DIR,
    UsageError,
    experiment_names,
    load_experiment,
)
from nvfp4train.reproduce.plan import (
    DEFAULT_RUNS_DIR,
    borrowed_text,
    copy_results,
    data_passes,
    describe,
    last_record,
    plan_experiment,
    run_state,
    shell,
    sweep_status,
)
from nvfp4train.runs import RunError, finished_run, read_run_info


def cuda_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def select(args, exp, device: str):
    return plan_experiment(exp, Path(args.runs_dir), args.arms, args.seeds, device)


def cmd_plan(args) -> int:
    exp = load_experiment(args.experiment, args.experiments_dir)
    runs = select(args, exp, args.device)
    for line in describe(exp, runs, args.gpu, args.gpus_per_run):
        print(line)
    print_commands(runs, args.gpus_per_run)
    made = [run for run in runs if run.source is None]
    print(
        f"\n{len(made)} run(s)"
        + (f"; {len(runs) - len(made)} borrowed ({borrowed_text(runs)})" if made != runs else "")
    )
    return 0


def print_commands(runs, gpus_per_run: int) -> None:
    """Each run's state, out_dir and commands (`plan`, `tune-lr --dry-run`); a borrowed run its lender's."""
    for run in runs:
        if run.source is not None:
            print(f"\n# {run.key} [{run_state(run.out_dir)}]  {borrowed_line(run)}")
            continue
        print(
            f"\n# {run.key} [{run_state(run.out_dir)}]  out_dir={run.out_dir}  ({run.max_steps} steps, "
            f"{run.tokens:,} tokens, {run.precision})"
        )
        print(shell(run.train_command(gpus_per_run)))
        if run.eval_args is not None:
            print(shell(run.eval_command()))


def borrowed_line(run) -> str:
    return f"borrowed: {run.source_key}, out_dir={run.out_dir}; not run here (`run {run.home[0]}` makes it)"


def experiments_named(args) -> list:
    """The experiments of a verb that takes several; --arms names one experiment's arms, so it takes one."""
    if len(args.experiments) > 1 and args.arms:
        raise UsageError(
            f"--arms {','.join(args.arms)}: arms belong to one experiment, and {len(args.experiments)} are named "
            f"({', '.join(args.experiments)}): name one experiment, or leave --arms out to run every arm"
        )
    if len(set(args.experiments)) < len(args.experiments):
        raise UsageError(f"an experiment is named twice: {' '.join(args.experiments)}")
    return [load_experiment(name, args.experiments_dir) for name in args.experiments]


def cmd_run(args) -> int:
    from nvfp4train.reproduce import executors

    exps = experiments_named(args)
    if args.executor == "slurm":
        paths = []
        for exp in exps:
            runs = []
            for run in select(args, exp, "cuda"):
                if run.source is not None:
                    print(f"{run.key}: {borrowed_line(run)}")
                else:
                    runs.append(run)
            if not runs:
                print(f"{exp.name}: every run selected is borrowed: no job array")
                continue
            path, _ = executors.render_slurm(
                exp.name, runs, Path(args.runs_dir), args.experiments_dir, args.gpus_per_run, extra_sbatch=args.sbatch
            )
            paths.append(path)
            print(f"{path}: job array of {len(runs)} task(s), {args.gpus_per_run} GPU(s) each")
            for i, run in enumerate(runs):
                print(f"  task {i}: {run.key} [{run_state(run.out_dir)}]")
        if not paths:
            print("nothing to submit")
            return 0
        if args.dry_run:
            print("dry run: not submitted (" + "; ".join(f"sbatch {p}" for p in paths) + " submits it)")
            return 0
        for path in paths:
            print(f"submitted job {executors.submit_slurm(path)}")
        return 0
    device = args.device or cuda_device()
    # seed by seed across the experiments (stable: experiments, then arms, keep their order within a seed), so
    # that a campaign stopped part-way leaves whole seeds of every experiment; a sweep's cells smallest first
    runs = sorted((run for exp in exps for run in select(args, exp, device)), key=lambda run: (run.order, run.seed))
    return run_here(args, runs, device)


def run_here(args, runs: list, device: str) -> int:
    """The local executor over planned runs, in their order (`run --executor local`, `tune-lr`): borrowed,
    finished, running and (without --retry-failed) failed runs skipped, each said in a line; --dry-run lists
    the queue. 1 where a run did not finish."""
    from nvfp4train.data.paths import git_commit
    from nvfp4train.reproduce import executors
    from nvfp4train.train.checkpoint import list_checkpoints

    gpus = executors.visible_gpus(args.gpus, device)
    if device == "cuda" and not gpus:
        raise UsageError("no CUDA GPU visible: pass --device cpu to run on the CPU")
    slots = executors.gpu_slots(gpus, args.gpus_per_run) if device == "cuda" else [None]
    todo = []
    for run in runs:
        state = run_state(run.out_dir)
        if run.source is not None:
            print(f"skip {run.key}: {borrowed_line(run)} [{state}]")
        elif state in ("done", "running") or (state == "failed" and not args.retry_failed):
            print(f"skip {run.key}: {state}" + (" (--retry-failed runs it again)" if state == "failed" else ""))
        else:
            todo.append(run)
            if state == "interrupted" and list_checkpoints(run.out_dir / "checkpoints"):
                print(f"{run.key}: interrupted before; resumes from its latest checkpoint")
    if args.dry_run or not todo:
        for i, run in enumerate(todo if args.dry_run else []):
            print(f"  queued {i + 1}: {run.key}")
        print("dry run: nothing started" if args.dry_run else "nothing to run")
        return 0
    datasets: dict[str, tuple[dict, int]] = {}  # each data config once, with the most tokens a run takes of it
    for run in todo:
        key = json.dumps(run.info["data"], sort_keys=True, default=str)
        datasets[key] = (run.info["data"], max(run.tokens, datasets.get(key, ({}, 0))[1]))
    for data_cfg, tokens in datasets.values():  # prepared once, before any run
        passes = data_passes(data_cfg, tokens, prepare=True)
        print(
            f"data {data_cfg.get('name', '')}: passes over each source in a run of {tokens:,} tokens: "
            + ", ".join(f"{k} {v:.1f}" for k, v in passes.items())
        )
    where = "the CPU, one run at a time" if device == "cpu" else f"GPU(s) {','.join(gpus)}, {len(slots)} at a time"
    print(f"{len(todo)} run(s) on {where}")
    commit = args.commit or git_commit(short=True)
    unfinished = executors.run_local(
        todo, slots, commit, args.gpus_per_run if device == "cuda" else 1, runs_per_process=args.runs_per_process
    )
    return 1 if unfinished else 0


def cmd_tune_lr(args) -> int:
    """The BF16 learning-rate scan of a sweep (nvfp4train/reproduce/tune_lr.py): its runs by `run`'s local
    executor, then the table per size and the lines to write into the file; --report: the table only."""
    factors, seeds = tune_lr.parse_factors(args.factors), tune_lr.parse_seeds(args.seeds)
    tokens_per_param = tune_lr.parse_tokens_per_param(args.tokens_per_param)
    exp = load_experiment(args.experiment, args.experiments_dir)
    scan = tune_lr.lr_scan(exp, factors, seeds, tokens_per_param)
    device = "cuda" if args.report else args.device or cuda_device()  # --report: only the out_dirs matter
    runs = plan_experiment(scan.exp, Path(args.runs_dir), device=device)
    for line in tune_lr.header_lines(scan, runs, Path(args.runs_dir)):
        print(line)
    rc = 0
    if not args.report:
        if args.dry_run:
            print_commands(runs, args.gpus_per_run)
            print()
        rc = run_here(args, runs, device)
        if args.dry_run:
            return rc
    print()
    for line in tune_lr.table_lines(scan, runs):
        print(line)
    return rc


def cmd_run_one(args) -> int:
    """One SLURM array task: the run on line --index of --run-list."""
    from nvfp4train.data.paths import git_commit
    from nvfp4train.reproduce import executors

    exp = load_experiment(args.experiment, args.experiments_dir)
    lines = Path(args.run_list).read_text().splitlines()
    if not 0 <= args.index < len(lines):
        raise UsageError(f"--index {args.index}: {args.run_list} has {len(lines)} run(s)")
    arm, seed = lines[args.index].split()
    run = plan_experiment(exp, Path(args.runs_dir), [arm], [int(seed)], "cuda")[0]
    state = run_state(run.out_dir)
    if state == "done":
        print(f"{run.key}: already done")
        return 0
    process = executors.RunProcess(run, git_commit(short=True), None, args.gpus_per_run)
    for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(s, lambda signum, frame: process.stop())
    state = process.execute()
    return 1 if state == "failed" else 0


def cmd_status(args) -> int:
    """Every run's state; a run is done by the rule `report` uses (`nvfp4train.runs.finished_run`), and one
    whose files say done but disagree shows as damaged, with its one line on stderr (exit 2). A sweep's
    borrowed run shows the state of the lender's directory, counted apart (the lender counts it)."""
    names = args.experiments or experiment_names(args.experiments_dir)
    print(f"{'run':<46} {'state':<12} {'step':>13} {'tokens':>13} {'loss':>7} {'tok/s':>10}")
    counts: dict[str, int] = {}
    damaged, grids = [], []
    for name in names:
        exp = load_experiment(name, args.experiments_dir)
        states, planned = {}, plan_experiment(exp, Path(args.runs_dir), device="cuda")
        for run in planned:
            state = run_state(run.out_dir)
            rec = {}
            try:
                read_run_info(run.out_dir)  # a damaged run.json is said, not read as "interrupted"
                if state == "done":
                    finished_run(run.out_dir)
                if state != "pending":
                    rec = last_record(run.out_dir) or {}
            except RunError as e:
                state = "damaged"
                damaged.append(str(e))
            counted = state if run.source is None else f"borrowed {state}"
            counts[counted] = counts.get(counted, 0) + 1
            states[run.key] = state
            if state == "pending" and not args.all:
                continue
            step, loss, speed = rec.get("step", 0), rec.get("loss"), rec.get("tokens_per_s")
            print(
                f"{run.key:<46} {state:<12} {f'{step}/{run.max_steps}':>13} "
                f"{rec.get('tokens', 0):>13,} {'-' if loss is None else f'{loss:.3f}':>7} "
                f"{'-' if speed is None else f'{speed:,.0f}':>10}"
                + ("" if run.source is None else f"  borrowed: {run.source_key}")
            )
        if exp.sweep is not None:
            grids += sweep_status(exp, planned, states)
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs planned")
    for line in grids:
        print(line)
    for line in dict.fromkeys(damaged):  # a borrowed run is its lender's too: said once
        print(f"error: {line}", file=sys.stderr)
    return 2 if damaged else 0


def cmd_copy_results(args) -> int:
    refused = 0
    for exp in experiments_named(args):
        for run in select(args, exp, "cuda"):
            try:
                print(f"{run.key}: {copy_results(run, Path(args.to))}")
            except UsageError as e:  # this run only: the others are still copied
                print(f"error: {run.key}: {e}", file=sys.stderr)
                refused += 1
    return 2 if refused else 0


def cmd_report(args) -> int:
    from nvfp4train.reproduce.report import write_report

    path = write_report(
        [Path(p) for p in args.runs_dir], Path(args.out), args.experiments_dir, figures=not args.no_figures
    )
    print(f"wrote {path}")
    return 0


def cmd_predict(args) -> int:
    from nvfp4train.reproduce.forecast import predict_command

    for line in predict_command(
        args.question, [Path(p) for p in args.runs_dir], args.experiments_dir, args.experiment, args.extrapolate
    ):
        print(line)
    return 0


def _runs_per_process(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of runs, 1 or more")
    return n


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m nvfp4train.reproduce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--experiments-dir", type=Path, default=EXPERIMENTS_DIR, help="where the experiment files are")
    verbs = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    def common(p, runs_dir=True, several=False):
        if several:
            p.add_argument("experiments", nargs="+", metavar="experiment", help="configs/reproduce/NAME.yaml ...")
        else:
            p.add_argument("experiment", help="configs/reproduce/NAME.yaml")
        p.add_argument(
            "--arms", type=lambda s: [a for a in s.split(",") if a], help="comma-separated arms (default all)"
        )
        p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], help="comma-separated seeds")
        p.add_argument("--gpus-per-run", type=int, default=1, help="GPUs per run (torchrun) (default 1)")
        if runs_dir:
            p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR), help=f"default {DEFAULT_RUNS_DIR}")

    p = verbs.add_parser("plan", help="every run with its commands and out_dir", description=cmd_plan.__doc__)
    common(p)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="commands for this device (default cuda)")
    p.add_argument("--gpu", help="a sweep's GPU-hours from the benchmarks of GPUs whose name contains this (e.g. H100)")

    def local_options(p, slurm=True):
        """The local executor's options (`run`, `tune-lr`)."""
        p.add_argument("--gpus", help="local: GPU indices to use, e.g. 0,1 (default: every visible GPU)")
        p.add_argument("--device", choices=["cuda", "cpu"], help="local: default cuda where available, else cpu")
        p.add_argument(
            "--retry-failed",
            action="store_true",
            help="local: run failed runs again: resuming from their latest checkpoint, or afresh "
            "without one (the failed attempt's files kept in <out_dir>.replaced-<time>/)",
        )
        p.add_argument(
            "--commit",
            help="local: the commit to record in run.json (default: git rev-parse HEAD of this "
            "checkout; a copy of the tree without .git records 'unknown')",
        )
        if slurm:
            p.add_argument(
                "--sbatch",
                action="append",
                help="slurm: an extra #SBATCH option, e.g. partition=gpu or --sbatch=--account=abc (repeatable)",
            )
        p.add_argument(
            "--runs-per-process",
            type=_runs_per_process,
            default=1,
            help="local: train up to N one-GPU runs one after the other in one process per GPU, which starts "
            "(imports, CUDA, compiled kernels) once instead of for every run (default 1: a process per run)",
        )
        p.add_argument(
            "--dry-run",
            action="store_true",
            help="show what would run" + (" / render the array" if slurm else "") + ", start nothing",
        )

    p = verbs.add_parser("run", help="run the experiments here (local) or submit them (slurm)")
    common(p, several=True)
    p.add_argument("--executor", choices=["local", "slurm"], default="local")
    local_options(p)

    p = verbs.add_parser(
        "tune-lr",
        help="a sweep's per-size peak lr from BF16 runs at lr x factors",
        description=tune_lr.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("experiment", help="configs/reproduce/NAME.yaml, a sweep")
    p.add_argument(
        "--factors",
        default=",".join(f"{f:g}" for f in tune_lr.DEFAULT_FACTORS),
        help="comma-separated multiples of each size's lr to train, each > 0 and once (default %(default)s)",
    )
    p.add_argument("--seeds", default="1", help="comma-separated seeds of every lr (default %(default)s)")
    p.add_argument(
        "--tokens-per-param",
        help="every size at this many tokens per parameter (any number > 0, also one the sweep does not run; "
        "default: 20 where the size has it, else its smallest)",
    )
    p.add_argument(
        "--executor", choices=["local"], default="local", help="local only (a SLURM task reads an experiment file)"
    )
    p.add_argument("--gpus-per-run", type=int, default=1, help="GPUs per run (torchrun) (default 1)")
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR), help=f"default {DEFAULT_RUNS_DIR}")
    local_options(p, slurm=False)
    p.add_argument(
        "--report",
        "--no-run",
        action="store_true",
        dest="report",
        help="only the table from the finished runs: start nothing",
    )

    p = verbs.add_parser("run-one", help="(SLURM array task) one run of a rendered array")
    p.add_argument("experiment")
    p.add_argument("--run-list", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR))
    p.add_argument("--gpus-per-run", type=int, default=1)

    p = verbs.add_parser("status", help="a table of every run's progress")
    p.add_argument("experiments", nargs="*", help="experiment names (default: all)")
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR))
    p.add_argument("--all", action="store_true", help="list pending runs too")

    p = verbs.add_parser("copy-results", help="copy finished runs' results (no checkpoints) to commit them")
    common(p, several=True)
    p.add_argument("--to", default="docs/results/runs", help="the results dir (default docs/results/runs)")

    p = verbs.add_parser("report", help="docs/results/reproduction.md from the finished runs")
    p.add_argument(
        "--runs-dir",
        action="append",
        help=f"a results dir (repeatable; default: docs/results/runs and {DEFAULT_RUNS_DIR})",
    )
    p.add_argument("--out", default="docs/results", help="where reproduction.md and its figures go")
    p.add_argument("--no-figures", action="store_true")

    p = verbs.add_parser("predict", help="the gap a sweep's fitted law predicts for a size and token budget")
    p.add_argument("question", nargs="+", metavar="KEY=VALUE", help="model=<preset or N> tokens=<D> precision=<arm>")
    p.add_argument("--experiment", help="the sweep (default: the only one in the experiments dir)")
    p.add_argument("--extrapolate", action="store_true", help="answer past 0.5 decade outside the sweep too")
    p.add_argument(
        "--runs-dir",
        action="append",
        help=f"a results dir (repeatable; default: docs/results/runs and {DEFAULT_RUNS_DIR})",
    )
    args = ap.parse_args(argv)
    if getattr(args, "runs_dir", "") is None:
        args.runs_dir = ["docs/results/runs", str(DEFAULT_RUNS_DIR)]
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    verbs = {
        "plan": cmd_plan,
        "run": cmd_run,
        "run-one": cmd_run_one,
        "status": cmd_status,
        "copy-results": cmd_copy_results,
        "report": cmd_report,
        "predict": cmd_predict,
        "tune-lr": cmd_tune_lr,
    }
    try:
        return verbs[args.verb](args)
    except (UsageError, RunError) as e:  # bad input (a run directory's files included): one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
