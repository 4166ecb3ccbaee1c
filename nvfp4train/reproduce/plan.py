"""The runs of an experiment (arm x seed), each with its exact training and evaluation commands, and
what state its out_dir is in.

A run lives in <runs-dir>/<experiment>/<arm>/seed<k>/ (the trainer's out_dir). Besides the trainer's
files (config.yaml, metrics.jsonl, checkpoints/) and the evaluator's eval.json, the executor writes
run.json when an attempt ends: its state (done | failed | interrupted), the exit codes, the commit, GPU
model, torch version, whether the run was deterministic, and the wall time summed over the attempts.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from nvfp4train import runs
from nvfp4train.reproduce.experiments import Experiment, UsageError

DEFAULT_RUNS_DIR = Path("runs/repro")
WHOLE_SPLIT = 1_000_000  # heldout_sequences for the final evaluation: every validation sequence there is


@dataclass
class Run:
    experiment: str
    arm: str
    seed: int
    out_dir: Path
    train_overrides: list[str]
    eval_args: list[str] | None
    max_steps: int
    tokens: int
    precision: str
    device: str = "cuda"  # cuda | cpu
    info: dict = field(default_factory=dict)
    order: float = 0.0  # a sweep's: the cell's training compute (parameters x tokens); runs go smallest first
    source: tuple[str, str] | None = None  # a sweep's borrowed cell: (the experiment that makes this run, its arm)

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.arm}/seed{self.seed}"

    @property
    def home(self) -> tuple[str, str]:
        """The experiment and arm whose directories hold this run (the lender's, for a borrowed one)."""
        return self.source or (self.experiment, self.arm)

    @property
    def source_key(self) -> str:
        return f"{self.home[0]}/{self.home[1]}/seed{self.seed}"

    def train_command(self, gpus_per_run: int = 1) -> list[str]:
        if gpus_per_run > 1:
            return [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={gpus_per_run}",
                "-m",
                "nvfp4train.train",
                *self.train_overrides,
            ]
        return [sys.executable, "-m", "nvfp4train.train", *self.train_overrides]

    def eval_command(self) -> list[str] | None:
        if self.eval_args is None:
            return None
        return [sys.executable, "-m", "nvfp4train.eval", f"run_dir={self.out_dir}", *self.eval_args]

    def final_checkpoint(self) -> Path:
        return self.out_dir / "checkpoints" / f"step_{self.max_steps:08d}"

    def final_eval_overrides(self) -> list[str] | None:
        """The eval line as train.final_eval keys, so that the training process evaluates its final checkpoint
        itself (the same eval.json as eval_command's, without a second start-up); None where there is no eval
        line or it sets a key that only the eval command takes (step; a device other than the training one)."""
        if self.eval_args is None:
            return None
        from nvfp4train.config.run import FinalEvalConfig
        from nvfp4train.config.schema import fields_of

        keys = set(fields_of(FinalEvalConfig) or ()) - {"enabled"}
        out = ["train.final_eval.enabled=true"]
        for arg in self.eval_args:
            key, _, value = arg.partition("=")
            if key == "device" and f"train.device={value}" in self.train_overrides:
                continue  # the trainer evaluates where it trained
            if key not in keys:
                return None
            out.append(f"train.final_eval.{key}={shlex.quote(value) if ',' in value else value}")
        return out


def shell(command: list[str]) -> str:
    """A command as a user types it (`python` for this interpreter)."""
    words = ["python" if i == 0 and w == sys.executable else w for i, w in enumerate(command)]
    return " ".join(shlex.quote(w) for w in words)


def compose_arm(overrides: list[str]) -> dict:
    """The resolved run config of `python -m nvfp4train.train OVERRIDES`, checked as the trainer checks it."""
    from omegaconf import OmegaConf

    from nvfp4train.config import ConfigError, RunConfig, compose

    try:
        cfg = compose("train", list(overrides))
        RunConfig.from_omegaconf(cfg)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # Hydra's and OmegaConf's own errors
        raise UsageError(" ".join(str(e).split())) from None
    return OmegaConf.to_container(cfg, resolve=True)


def plan_experiment(
    exp: Experiment,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    device: str = "cuda",
) -> list[Run]:
    """Every run of `exp` (its own arms, not the borrowed ones; a sweep's borrowed cells as the lender's runs,
    `Run.source`, which `run` leaves to the lender), optionally only some arms or seeds, seed by seed: the runs
    of one seed (every arm) come together, so a campaign stopped part-way leaves whole seeds, which are what
    the paired comparison needs."""
    for arm in arms or []:
        if arm not in exp.arms:
            raise UsageError(f"--arms {arm}: not an arm of {exp.name}; allowed: {', '.join(exp.arms)}")
    runs = []
    for arm_name in arms or list(exp.arms):
        own = _plan_arm(exp, arm_name, runs_dir, seeds, device)
        borrow = exp.arms[arm_name].borrow
        if borrow is not None and own:
            lender = exp.sweep.lenders[borrow[0]]
            theirs = {r.seed: r for r in _plan_arm(lender, borrow[1], runs_dir, [r.seed for r in own], device)}
            own = [
                replace(
                    run,
                    out_dir=theirs[run.seed].out_dir,
                    train_overrides=theirs[run.seed].train_overrides,
                    eval_args=theirs[run.seed].eval_args,
                    source=borrow,
                )
                for run in own
            ]
        runs += own
    if seeds is not None and not runs:
        raise UsageError(
            f"--seeds {','.join(map(str, seeds))}: no arm of {exp.name} runs these seeds "
            f"(its seeds: {', '.join(map(str, exp.seeds))})"
        )
    # stable: arms keep their order within a seed; a sweep's cells go smallest first, each seed by seed
    return sorted(runs, key=lambda run: (run.order, run.seed))


def _plan_arm(exp: Experiment, arm_name: str, runs_dir: Path, seeds: list[int] | None, device: str) -> list[Run]:
    """The runs of one arm of `exp` as `exp` would make them (in its own directories)."""
    runs = []
    extra = ["train.device=cpu"] if device == "cpu" else []
    arm = exp.arms[arm_name]
    cfg = compose_arm(list(exp.base) + list(arm.overrides) + extra)
    t = cfg["train"]
    per_step = int(t["global_batch_size"]) * int(t["seq_len"])
    budget, params = arm.tokens or exp.tokens, None
    if arm.tokens_per_param is not None:  # a sweep's cell: the budget from the model's size
        params = model_params(cfg["model"])[1]
        budget = arm.tokens_per_param * params
    steps = max(1, round(budget / per_step))
    every = [f"train.eval_every={max(1, round(steps / exp.eval_points))}"] if exp.eval_points else []
    for seed in arm.seeds:
        if seeds is not None and seed not in seeds:
            continue
        out_dir = Path(runs_dir) / exp.name / arm_name / f"seed{seed}"
        overrides = (
            list(exp.base)
            + list(arm.overrides)
            + extra
            + every
            + [
                f"train.max_steps={steps}",
                f"seed={seed}",
                f"experiment={exp.name}",
                f"out_dir={out_dir}",
                "train.progress=false",
            ]
        )
        eval_args = None if exp.eval is None else list(exp.eval) + (["device=cpu"] if device == "cpu" else [])
        runs.append(
            Run(
                exp.name,
                arm_name,
                seed,
                out_dir,
                overrides,
                eval_args,
                steps,
                steps * per_step,
                str(cfg["precision"].get("name") or cfg["precision"].get("format")),
                device,
                {"model": cfg["model"], "data": cfg["data"], "per_step": per_step, "params": params},
                0.0 if params is None else float(params) * steps * per_step,
            )
        )
    return runs


def _first_difference(ours, theirs, where: str = "") -> tuple[str, object, object] | None:
    """The first key (dotted, in our order) whose value differs between two composed configs, with both values
    (a key one lacks: None for it)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in list(ours) + [k for k in theirs if k not in ours]:
            found = _first_difference(ours.get(key), theirs.get(key), f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    return None if ours == theirs else (where, ours, theirs)


def check_borrowed_cells(exp: Experiment) -> None:
    """A sweep's borrowed cells (`sweep.sizes[].borrow`) are the lender's runs only where the sweep would make
    the same ones: each cell at the lender's token budget, and each arm's training config, composed as the
    trainer composes it (`experiment` and `out_dir` aside), and evaluation the lender's. UsageError naming
    the file, the key and the first difference, otherwise."""
    runs_dir = Path("runs")
    for i, size in enumerate(exp.sweep.sizes):
        if size.borrow is None:
            continue
        where = f"{exp.path}: sweep.sizes[{i}].borrow={size.borrow!r}"
        for tpp in size.tokens_per_param:
            for template in size.arms:
                arm = exp.arms[f"{size.name}-tpp{tpp:g}-{template}"]
                lender_name, lender_arm = arm.borrow
                lender = exp.sweep.lenders[lender_name]
                ours = _plan_arm(exp, arm.name, runs_dir, [arm.seeds[0]], "cuda")[0]
                theirs = _plan_arm(lender, lender_arm, runs_dir, [arm.seeds[0]], "cuda")[0]
                if ours.tokens != theirs.tokens:
                    raise UsageError(
                        f"{where}: the cell at tokens_per_param {tpp:g} trains {ours.tokens:,} tokens, "
                        f"{lender_name}'s {lender_arm} {theirs.tokens:,}; a size borrows only at its lender's "
                        f"budget (here {theirs.tokens / ours.info['params']:.3g} tokens per parameter)"
                    )
                drop = ("experiment", "out_dir")
                mine = {k: v for k, v in compose_arm(ours.train_overrides).items() if k not in drop}
                lenders = {k: v for k, v in compose_arm(theirs.train_overrides).items() if k not in drop}
                found = _first_difference(mine, lenders)
                if found is None and ours.eval_args != theirs.eval_args:
                    found = ("eval", ours.eval_args, theirs.eval_args)
                if found:
                    key, here, there = found
                    raise UsageError(
                        f"{where}: arm {template} at tokens_per_param {tpp:g} would not be {lender_name}'s "
                        f"{lender_arm} runs: {key} is {here!r} here, {there!r} there"
                    )


# ------------------------------------------------------------------------------------------- state
def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def last_record(out_dir: Path) -> dict | None:
    """The last metrics record with a training loss (metrics.jsonl, or the committed metrics.jsonl.gz), None
    without metrics; RunError where they cannot be read."""
    if runs.metrics_file(out_dir) is None:
        return None
    return runs.read_metrics(out_dir).last("loss")


def run_state(out_dir: Path) -> str:
    """pending (nothing there) | running (an executor holds it) | done | failed | interrupted (will resume)."""
    out_dir = Path(out_dir)
    marker = read_json(out_dir / "executor.json")
    if marker and marker.get("host") == os.uname().nodename and pid_alive(marker.get("pid")):
        return "running"
    info = read_json(out_dir / "run.json")
    state = runs.recorded_state(info)
    if state in ("done", "failed"):
        return state
    if runs.metrics_file(out_dir) is not None or (out_dir / "checkpoints").is_dir():
        return "interrupted"
    return "pending"


RESULT_FILES = ("config.yaml", "eval.json", "run.json")  # with metrics.jsonl, gzipped: what a result keeps
PARTIAL_MARKER = ".made-by-copy-results"  # in a <seed>.partial/ of copy-results' own: the only kind it removes


def _open_result_file(path: Path):
    """A run's result file for reading, never through a symbolic link (it could point anywhere, and the copy
    is meant to be committed) and never a FIFO or device: UsageError naming it."""
    import stat

    why = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(path):
            why = f"is a symbolic link (to {os.readlink(path)})"
        else:
            raise UsageError(f"{path}: unreadable ({e.strerror})") from None
    else:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            why = "is not a regular file"
    if why:
        raise UsageError(f"{path} {why}; copy-results copies a run's own files only: not copied")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def copy_results(run: Run, results_dir: Path) -> str:
    """Copy a finished run's results (no checkpoints) to results_dir/<experiment>/<arm>/seed<k>/ (a borrowed
    run's: the lender's experiment and arm, where `report` looks for it), metrics gzipped (a tenth of the
    size; `report` and `compare` read it so). Never overwrites: a run already there is left as it is. A file
    of the run that is a link is refused (UsageError), and so is a `<seed>.partial/` left in the way that
    copy-results did not make. Returns what happened, in a few words."""
    import gzip
    import shutil

    state = run_state(run.out_dir)
    if state != "done":
        return f"skipped ({state})"
    dest = Path(results_dir) / run.home[0] / run.home[1] / f"seed{run.seed}"  # a borrowed run: the lender's
    if os.path.lexists(dest):
        return f"already in {dest}"
    sources = [n for n in RESULT_FILES if os.path.lexists(run.out_dir / n)] + ["metrics.jsonl"]
    files = {}
    try:
        for name in sources:  # all opened (and so checked) before anything is written
            files[name] = _open_result_file(run.out_dir / name)
        tmp = dest.with_name(dest.name + ".partial")
        if os.path.lexists(tmp):
            if tmp.is_symlink() or not (tmp / PARTIAL_MARKER).is_file() or (tmp / PARTIAL_MARKER).is_symlink():
                raise UsageError(
                    f"{tmp} is in the way and was not made by copy-results: remove or move it, then copy again"
                )
            shutil.rmtree(tmp)  # copy-results' own, left by an interrupted copy
        tmp.mkdir(parents=True)
        (tmp / PARTIAL_MARKER).write_text("")
        for name in RESULT_FILES:
            if name in files:
                with open(tmp / name, "wb") as out:
                    shutil.copyfileobj(files[name], out)
        with open(tmp / "metrics.jsonl.gz", "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:  # same bytes for the same run
                shutil.copyfileobj(files["metrics.jsonl"], out)
    finally:
        for f in files.values():
            f.close()
    (tmp / PARTIAL_MARKER).unlink()
    tmp.rename(dest)
    return f"copied into {dest}"


def pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError, PermissionError):
        return False
    try:  # a zombie counts as gone
        return Path(f"/proc/{int(pid)}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


# ------------------------------------------------------------------------------------- data passes
def data_passes(data_cfg: dict, tokens: int, prepare: bool = False) -> dict[str, float] | None:
    """Passes over each source's training tokens that `tokens` of training make (by the phase weights).
    prepare: tokenize raw sources first (cached, locked: what a run would do); else None unless every
    source's training split is token shards already (given, or in the cache from an earlier run)."""
    from nvfp4train.data.config import parse_data_config
    from nvfp4train.data.prepare import prepare_all
    from nvfp4train.data.shards import read_manifest

    data = parse_data_config(data_cfg)
    try:
        dirs = prepare_all(data_cfg, splits=("train",), progress=False, cached_only=not prepare)
    except (ValueError, FileNotFoundError) as e:
        if prepare:
            raise UsageError(f"data {data.name}: {e}") from None
        return None  # the run says what is wrong with its data when it reads it
    if len(dirs) < len(data.sources) or not all((Path(d) / "manifest.json").is_file() for d in dirs.values()):
        return None
    available = {key.split("/")[0]: read_manifest(d)["n_tokens"] for key, d in dirs.items()}
    drawn = dict.fromkeys(data.sources, 0.0)
    starts = [float(p.start) for p in data.phases] + [1.0]
    for i, phase in enumerate(data.phases):
        for name, weight in phase.weights.items():
            drawn[name] += float(weight) * (starts[i + 1] - starts[i]) * tokens
    return {name: drawn[name] / available[name] for name in drawn if available.get(name)}


def model_params(model_cfg: dict) -> tuple[int, int]:
    """(all parameters, without embedding and LM head), counted from the config (no model is built, and no
    torch imported: `ModelConfig.num_params`, which tests/model/test_presets.py checks against the built model)."""
    from nvfp4train.model import ModelConfig

    cfg = ModelConfig.from_dict(model_cfg)
    return cfg.num_params(), cfg.num_params(exclude_embeddings=True)


def describe(exp: Experiment, runs: list[Run], gpu: str | None = None, gpus_per_run: int = 1) -> list[str]:
    """The plan's header: model size, tokens per parameter, passes over the data; a sweep's grid."""
    if not runs:
        return [f"{exp.name}: no runs selected"]
    if exp.sweep is not None:
        return [
            f"{exp.name} (sweep): {exp.description}",
            *sweep_grid(exp, runs, gpu, gpus_per_run),
            f"  baseline {exp.baseline}",
        ]
    first = runs[0]
    params, non_embedding = model_params(first.info["model"])
    passes = data_passes(first.info["data"], first.tokens)
    where = (
        "passes over each source " + ", ".join(f"{k} {v:.1f}" for k, v in passes.items())
        if passes
        else "passes over the data: unknown until the token shards are prepared"
    )
    return [
        f"{exp.name} (tier {exp.tier}): {exp.description}",
        f"  model {first.info['model']['name']}: {params / 1e6:.2f}M parameters, {non_embedding / 1e6:.2f}M "
        f"without embedding and LM head; {first.tokens:,} tokens per run ({first.max_steps} steps x "
        f"{first.info['per_step']:,}) = {first.tokens / non_embedding:.1f} tokens per non-embedding parameter; "
        f"{where}",
        f"  baseline {exp.baseline}"
        + (
            f"; compared with borrowed arms {', '.join(f'{a} ({e})' for a, e in exp.borrow.items())}"
            if exp.borrow
            else ""
        ),
    ]


# ------------------------------------------------------------------------------------------ sweeps
BENCH_FILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "bench" / "train.json"


def bench_rows(path: Path = BENCH_FILE) -> list[dict]:
    """The measured training throughputs (python -m benchmarks.bench_train's rows), [] where there are none."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def measured_speed(run: Run, rows: list[dict], gpu: str | None = None) -> tuple[float, list[str]] | None:
    """The median tokens/s of the benchmark rows of this run's model, precision, sequence length and
    batch (on GPUs whose name contains `gpu`), and the GPUs they were measured on; None: unmeasured."""
    import statistics

    t = compose_train(run)
    found = [
        r
        for r in rows
        if r.get("model") == run.info["model"].get("name")
        and r.get("precision") == run.precision
        and r.get("seq") == t["seq_len"]
        and r.get("batch") == t["global_batch_size"]
        and isinstance(r.get("tokens_per_s"), (int, float))
        and r["tokens_per_s"] > 0
        and (gpu is None or gpu.lower() in str(r.get("gpu", "")).lower())
    ]
    if not found:
        return None
    return statistics.median(float(r["tokens_per_s"]) for r in found), sorted({str(r.get("gpu")) for r in found})


RESULTS_DIR = BENCH_FILE.parents[1] / "runs"


def run_overhead(results_dir: Path = RESULTS_DIR, gpu: str | None = None) -> tuple[float, int] | None:
    """What a run costs besides its training steps (start-up, compilation, in-training evaluations,
    checkpoints, the final evaluation): the median over the finished runs under results_dir (on GPUs whose
    name contains `gpu`) of run.json's wall time minus max_steps x the median step time of its metrics, and
    how many runs that is; None where there is none."""
    import gzip
    import statistics

    overheads = []
    for info_path in sorted(Path(results_dir).glob("*/*/seed*/run.json")):
        info = read_json(info_path) or {}
        wall, steps, on = info.get("wall_s"), info.get("max_steps"), str(info.get("gpu", ""))
        if info.get("state") != "done" or not isinstance(wall, (int, float)) or not isinstance(steps, int):
            continue
        if on in ("", "cpu") or (gpu is not None and gpu.lower() not in on.lower()):
            continue
        metrics = info_path.parent / "metrics.jsonl.gz"
        try:
            with gzip.open(metrics, "rt") as f:
                times = [r["step_time_s"] for r in map(json.loads, f) if isinstance(r.get("step_time_s"), float)]
        except (OSError, ValueError, EOFError):
            continue
        if times:
            overheads.append(wall - steps * statistics.median(times))
    if not overheads:
        return None
    return statistics.median(overheads), len(overheads)


def compose_train(run: Run) -> dict:
    words = dict(o.split("=", 1) for o in run.train_overrides if "=" in o)
    return {"seq_len": int(words["train.seq_len"]), "global_batch_size": int(words["train.global_batch_size"])}


def _cells(exp: Experiment, runs: list[Run]) -> dict[tuple[str, float], list[Run]]:
    """The runs of a sweep, cell by cell, in the order they run (smallest compute first)."""
    cells: dict[tuple[str, float], list[Run]] = {}
    for run in sorted(runs, key=lambda r: r.order):
        size, tpp, _ = exp.arms[run.arm].cell
        cells.setdefault((size, tpp), []).append(run)
    return cells


def _arm_counts(exp: Experiment, runs: list[Run], count=None) -> str:
    counts: dict[str, list[int]] = {}
    for run in runs:
        c = counts.setdefault(exp.arms[run.arm].cell[2], [0, 0])
        c[0] += 1 if count is None else int(count(run))
        c[1] += 1
    if count is None:
        return ", ".join(f"{a} x{n}" for a, (n, _) in counts.items())
    return ", ".join(f"{a} {done}/{n}" for a, (done, n) in counts.items())


def sweep_grid(exp: Experiment, runs: list[Run], gpu: str | None = None, gpus_per_run: int = 1) -> list[str]:
    """The grid a sweep plans, smallest cell first: per cell its size, tokens per parameter, tokens, arms
    with their seeds, and GPU-hours from the measured throughput (docs/results/bench/train.json), or
    "unmeasured" where no row measured that model and precision; a borrowed cell says whose runs it takes,
    and the totals count only the runs the sweep makes."""
    from nvfp4train.reproduce.scaling import count_text

    rows = bench_rows()
    overhead = run_overhead(gpu=gpu)
    per_run = overhead[0] if overhead else 0.0
    lines = [
        f"{exp.name}: a sweep of {len({exp.arms[r.arm].cell[:2] for r in runs})} cells over "
        f"{len(exp.sweep.sizes)} sizes, smallest first; GPU-hours: the training steps from the median tokens/s "
        f"of {BENCH_FILE.relative_to(BENCH_FILE.parents[3]) if BENCH_FILE.is_file() else 'the benchmark'} "
        "rows of the same model, precision, seq_len and batch (measured without train.deterministic, which "
        "costs some tokens/s: docs/determinism.md), "
        + (
            f"plus {per_run:.0f} s a run for the rest (start-up, evaluations, checkpoints: the median of wall "
            f"time - steps x step time over the {overhead[1]} finished runs in "
            f"{RESULTS_DIR.relative_to(BENCH_FILE.parents[3])})"
            if overhead
            else "training only (no finished run to measure the rest of a run's time by)"
        )
        + "; unmeasured where there is none; passes: the most passes over one data source (? until the "
        "token shards are prepared)",
        f"  {'cell':<24} {'N':>7} {'D/N':>5} {'tokens':>13} {'steps':>6} {'passes':>6}  {'GPU-hours':<22} arms (seeds)",
    ]
    total, unmeasured, gpus_seen = 0.0, 0, set()
    for (size, tpp), cell_runs in _cells(exp, runs).items():
        first = cell_runs[0]
        hours, missing = 0.0, 0
        for run in cell_runs:
            if run.source is not None:
                continue
            speed = measured_speed(run, rows, gpu)
            if speed is None:
                missing += 1
            else:
                hours += (run.tokens / speed[0] + per_run) / 3600 * gpus_per_run
                gpus_seen.update(speed[1])
        total += hours
        unmeasured += missing
        lenders = sorted({run.source[0] for run in cell_runs if run.source is not None})
        made = [run for run in cell_runs if run.source is None]
        if not made:
            text = "borrowed"
        elif missing == len(made):
            text = "unmeasured"
        elif missing:
            text = f"{hours:.2f} + {missing} unmeasured"
        else:
            text = f"{hours:.2f}"
        passes = data_passes(first.info["data"], first.tokens)
        most = f"{max(passes.values()):.1f}" if passes else "?"
        lines.append(
            f"  {f'{size}-tpp{tpp:g}':<24} {count_text(first.info['params']):>7} {tpp:>5g} {first.tokens:>13,} "
            f"{first.max_steps:>6} {most:>6}  {text:<22} {_arm_counts(exp, cell_runs)}"
            + (f" (the runs of {', '.join(lenders)})" if lenders else "")
        )
    made = [run for run in runs if run.source is None]
    borrowed = len(runs) - len(made)
    lines.append(
        f"  {len(made)} run(s): {total:.2f} GPU-hours for the {len(made) - unmeasured} measured"
        + (f" (on {', '.join(sorted(gpus_seen))})" if gpus_seen else "")
        + (f"; {unmeasured} unmeasured (benchmark their model: python -m benchmarks.bench_train)" if unmeasured else "")
        + (f"; {borrowed} more borrowed, not run here ({borrowed_text(runs)})" if borrowed else "")
    )
    return lines


def borrowed_text(runs: list[Run]) -> str:
    """Which experiments make the borrowed ones of `runs`, with how many each: "9 of b_fp8_vs_nvfp4"."""
    counts: dict[str, int] = {}
    for run in runs:
        if run.source is not None:
            counts[run.source[0]] = counts.get(run.source[0], 0) + 1
    return ", ".join(f"{n} of {name}" for name, n in counts.items())


def sweep_status(exp: Experiment, runs: list[Run], states: dict[str, str]) -> list[str]:
    """The grid of a sweep with, per cell and arm, its finished runs of those planned (states: run key ->
    state, as `status` found them)."""
    lines = [f"{exp.name}: the grid, smallest cell first (done/planned per arm)"]
    for (size, tpp), cell_runs in _cells(exp, runs).items():
        lines.append(
            f"  {f'{size}-tpp{tpp:g}':<24} {_arm_counts(exp, cell_runs, lambda r: states.get(r.key) == 'done')}"
        )
    return lines
