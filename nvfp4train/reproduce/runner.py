"""`python -m nvfp4train.reproduce VERB`: the scaled-down reproduction of "Pretraining LLMs with NVFP4"
(arXiv 2509.25149) on GPU machines lent for half an hour at a time.

    here:        pack-data                      prepare the corpora's token shards -> .carry/shards.tar.xz
    GPU machine: launch EXPERIMENT... [--gpus N] [--per-gpu N|auto] [--tokens N | --budget-minutes M]
                                      [--skip-existing docs/results/runs] [--force] [--dry-run]
                 poll                           one line per run: step, tokens, loss, tokens/s, ETA
                 wait [--timeout-s N]           until every run has ended (exit 1: the time ran out)
                 collect --out $OUT             finished runs -> ONE archive (no checkpoints)
                 pack-kernels --out $OUT        Triton's and Inductor's caches -> kernels.tar.gz (carry it back as
                                                .carry/kernels.tar.gz: the next launch skips the autotuning)
    here:        ingest ARCHIVE                 -> docs/results/runs/<experiment>/<arm>/seed<k>/
                 report                         -> docs/results/reproduction.md (+ plots per experiment)

A device command runs at most 10 minutes and the machine goes back soon after it ends, so one command
launches, waits and collects:

    python -m nvfp4train.reproduce launch fp8_vs_nvfp4 --per-gpu auto --skip-existing docs/results/runs \
      && python -m nvfp4train.reproduce wait --timeout-s 500; python -m nvfp4train.reproduce collect --out $OUT

An experiment is configs/reproduce/<name>.yaml (`_common.yaml` holds what every experiment shares): its
arms (name -> Hydra overrides of `python -m nvfp4train.train`), its seeds, its token budget, the arm the
others are measured against, arms it borrows from another experiment for its report, and the GPU memory
one run takes per precision format (gib_per_run). Every arm of every experiment trains the same model on
the same data order with the same schedule; only the overrides differ. `launch` plans experiment x arm x
seed onto the GPUs present (several runs per GPU with --per-gpu N, checked against each GPU's free memory;
--per-gpu auto starts as many as fit), starts one detached worker per slot (each runs its queue of runs
one after the other, training then evaluating) and returns at once. Runs live in --runs-dir
(runs/repro/<experiment>/<arm>/seed<k>/, the trainer's out_dir) beside the runner's own files: job.json
(the plan's entry), worker.pid, started, console.log (the trainer's and evaluator's terminal output) and,
once the run ended, run.json (commit, GPU, torch version, wall time, exit codes).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nvfp4train.train.kernel_cache import KERNEL_ARCHIVE, KernelCacheError, pack_kernel_cache, unpack_kernel_cache

REPO = Path(__file__).resolve().parents[2]
# configs/ of a source checkout, or the copy a wheel carries inside the package (as train/config.py finds it)
CONFIGS = REPO / "nvfp4train" / "configs" if (REPO / "nvfp4train" / "configs").is_dir() else REPO / "configs"
EXPERIMENTS_DIR = CONFIGS / "reproduce"
RESULTS_DIR = Path("docs/results")         # relative to the working directory, as runs/ is
DEFAULT_RUNS_DIR = Path("runs/repro")
DATA_ARCHIVE = Path(".carry/shards.tar.xz")
SHARDS_DIR = Path("data/corpora/shards")
ARCHIVE_LIMIT = 16 * 2**20                 # what one file brought back from a GPU machine may weigh
COLLECTED = ("metrics.jsonl", "config.yaml", "eval.json", "run.json")
# Tokens per second that one GPU gives runs of hybrid_repro (seq 1024, batch 32) of each precision format,
# summed over the runs sharing it: the committed runs of commit 55f312a on an H200 (docs/results/runs/,
# run.json and metrics.jsonl), 11 runs at once: per-run tokens/s x 11 = bf16 577k, fp8_blockwise 353k,
# nvfp4 365k; mxfp4 at 7 at once 347k. fp8_tensorwise has not run: fp8_blockwise's figure stands in. A run
# sharing its GPU with n-1 others is estimated at 1/n of it. Alone on an H100 (bench_train, eager) the
# same runs do bf16 492k, fp8_blockwise 298k, nvfp4 291k, mxfp4 281k: sharing raises the total. `poll`
# shows the measured speed; --speed FORMAT=TOKENS_PER_S corrects the estimate.
ASSUMED_SPEED = {"bf16": 577_000, "fp8_blockwise": 353_000, "fp8_tensorwise": 353_000, "nvfp4": 365_000,
                 "mxfp4": 347_000}
CPU_SPEED = 3_000                          # tokens/s of a tiny CPU run, for the plan's estimate only
CPU_STARTUP_S = 15
# Per run: imports, Triton autotuning of the SSD scan (unless a carried kernel cache has it), the periodic
# and final evaluations: the 55f312a runs spent 180-187 s before their first step on a fresh H200 (11 at
# once), 49 s on the warm machine (7 at once), and 250-350 s of their 540-566 s outside training steps.
STARTUP_S = 240


class UsageError(Exception):
    """Bad input: one line, exit code 2."""


# ------------------------------------------------------------------------------------------ experiments
@dataclass
class Arm:
    name: str
    overrides: list[str]
    tokens_factor: float = 1.0     # e.g. 1.36: this arm trains on 1.36x the experiment's tokens


@dataclass
class Experiment:
    name: str
    description: str
    tokens: int
    seeds: list[int]
    base: list[str]
    arms: dict[str, Arm]
    baseline: str
    borrow: dict[str, str] = field(default_factory=dict)   # arm -> the experiment whose runs it reuses
    eval: list[str] | None = None                          # `python -m nvfp4train.eval` arguments
    gib_per_run: dict[str, float] = field(default_factory=dict)  # precision format (or default) -> GiB of GPU memory


def experiment_names(directory: Path) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.yaml") if not p.name.startswith("_"))


def load_experiment(name: str, directory: Path = EXPERIMENTS_DIR) -> Experiment:
    import yaml

    path = Path(directory) / f"{name}.yaml"
    if not path.is_file():
        raise UsageError(f"experiment {name!r}: no {path}; allowed: {', '.join(experiment_names(directory))}")
    common_path = Path(directory) / "_common.yaml"
    common = yaml.safe_load(common_path.read_text()) or {} if common_path.is_file() else {}
    own = yaml.safe_load(path.read_text()) or {}
    allowed = {"description", "tokens", "seeds", "base", "arms", "baseline", "borrow", "eval", "gib_per_run"}
    for source, spec in ((common_path, common), (path, own)):
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise UsageError(f"{source}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
        check_gib_per_run(source, spec.get("gib_per_run"))
    spec = {**common, **own, "base": list(common.get("base") or []) + list(own.get("base") or []),
            "gib_per_run": {**(common.get("gib_per_run") or {}), **(own.get("gib_per_run") or {})}}
    for key in ("tokens", "seeds", "arms", "baseline"):
        if spec.get(key) in (None, [], {}):
            raise UsageError(f"{path}: {key} missing (in it or in {common_path.name})")
    arms = {}
    for arm_name, arm_spec in spec["arms"].items():
        if isinstance(arm_spec, dict):
            arms[arm_name] = Arm(arm_name, list(arm_spec.get("overrides") or []),
                                 float(arm_spec.get("tokens_factor", 1.0)))
        else:
            arms[arm_name] = Arm(arm_name, list(arm_spec or []))
    borrow = dict(spec.get("borrow") or {})
    if spec["baseline"] not in arms and spec["baseline"] not in borrow:
        raise UsageError(f"{path}: baseline {spec['baseline']!r} is neither one of its arms nor borrowed")
    return Experiment(name=name, description=str(spec.get("description", "")).strip(), tokens=int(spec["tokens"]),
                      seeds=[int(s) for s in spec["seeds"]], base=[str(o) for o in spec["base"]], arms=arms,
                      baseline=spec["baseline"], borrow=borrow, eval=spec.get("eval"),
                      gib_per_run={k: float(v) for k, v in spec["gib_per_run"].items()})


def check_gib_per_run(source: Path, table) -> None:
    """gib_per_run: {FORMAT: GiB, ..., default: GiB}, what one run takes of its GPU's memory, by precision format."""
    if table is None:
        return
    from nvfp4train.precision.recipe import FORMATS

    allowed = (*FORMATS, "default")
    if not isinstance(table, dict):
        raise UsageError(f"{source}: gib_per_run is {table!r}; expected a mapping FORMAT: GiB with FORMAT one of "
                         f"{', '.join(allowed)}")
    for key, value in table.items():
        if key not in allowed:
            raise UsageError(f"{source}: gib_per_run.{key}: unknown precision format; allowed: {', '.join(allowed)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UsageError(f"{source}: gib_per_run.{key}={value!r}; expected GiB per run, a number > 0")


def resolve_experiments(names: list[str], directory: Path) -> list[Experiment]:
    if names == ["all"]:
        names = experiment_names(directory)
    return [load_experiment(n, directory) for n in names]


# ------------------------------------------------------------------------------------------- pack-data
def pack_data(args) -> int:
    """Tokenize every source of the corpora config into SHARDS_DIR/<source>/{train,val} and pack them."""
    import yaml

    from nvfp4train.data.prepare import prepare_split
    from nvfp4train.data.shards import read_manifest

    cfg = yaml.safe_load((REPO / args.config).read_text())
    members = []
    for name, src in cfg["sources"].items():
        for split in ("train", "val"):
            raw = src.get(split)
            if raw is None:
                continue
            if not (REPO / raw).is_file():
                raise UsageError(f"{raw}: missing; build the corpora first: python scripts/build_corpora.py --corpora")
            out = REPO / SHARDS_DIR / name / split
            manifest = prepare_split(raw, out, tokenizer=cfg["tokenizer"], num_proc=os.cpu_count() or 1)
            print(f"{name}/{split}: {manifest['n_docs']:,} documents, {manifest['n_tokens']:,} tokens")
            members.append(out)
    archive = REPO / args.out
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for split_dir in members:
            for f in sorted(read_manifest(split_dir)["shards"], key=lambda s: s["file"]):
                for part in (f["file"], f["index"]):
                    tar.add(split_dir / part, arcname=str((SHARDS_DIR / split_dir.relative_to(REPO / SHARDS_DIR)
                                                           / part).as_posix()))
            tar.add(split_dir / "manifest.json", arcname=f"{(split_dir.relative_to(REPO)).as_posix()}/manifest.json")
    print(f"{args.out}: {archive.stat().st_size / 2**20:.1f} MiB (carry it: unpacked by launch into {SHARDS_DIR}/)")
    return 0


def unpack_data(archive: Path) -> bool:
    """Unpack the shards archive into the repository (once). Returns whether it unpacked anything."""
    if not archive.is_file():
        return False
    marker = REPO / SHARDS_DIR / ".unpacked"
    stamp = f"{archive.stat().st_size}:{int(archive.stat().st_mtime)}"
    if marker.is_file() and marker.read_text() == stamp:
        return False
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(SHARDS_DIR.as_posix() + "/") or ".." in member.name.split("/"):
                raise UsageError(f"{archive}: unexpected member {member.name!r} (expected {SHARDS_DIR}/...)")
        tar.extractall(REPO, filter="data")
    marker.write_text(stamp)
    return True


# -------------------------------------------------------------------------------------------- planning
@dataclass
class Job:
    experiment: str
    arm: str
    seed: int
    overrides: list[str]           # everything after `python -m nvfp4train.train`
    eval: list[str] | None
    out_dir: str
    max_steps: int
    tokens: int
    precision: str
    speed: float                   # assumed tokens/s of this run (alone on its GPU)
    tokens_factor: float = 1.0
    startup_s: float = STARTUP_S
    gib: float | None = None       # GPU memory it takes (the experiment's gib_per_run); None: not given
    slot: int = 0
    device: str = "cuda"           # cuda:<index> or cpu
    per_device: int = 1            # slots on its device: runs training on it at once

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.arm}/seed{self.seed}"

    def estimate_s(self) -> float:
        return self.tokens / (self.speed / self.per_device) + self.startup_s


def compose_arm(overrides: list[str]) -> dict:
    """The resolved run config of `python -m nvfp4train.train OVERRIDES`, checked like the trainer checks it."""
    from omegaconf import OmegaConf

    from nvfp4train.train.config import ConfigError, RunConfig, compose

    try:
        cfg = compose(overrides)
        RunConfig.from_omegaconf(cfg)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # Hydra's and OmegaConf's own errors
        raise UsageError(" ".join(str(e).split())) from None
    return OmegaConf.to_container(cfg, resolve=True)


def model_params(model_cfg: dict) -> tuple[int, int]:
    """(all parameters, without embedding and LM head), built on the meta device."""
    from nvfp4train.model import ModelConfig
    from nvfp4train.summary import summarize

    s = summarize(ModelConfig.from_dict(model_cfg), 1)
    return s["params"], s["params_non_embedding"]


def data_epochs(cfg: dict, tokens: int) -> dict[str, float]:
    """Passes over each source's training tokens that `tokens` of training make, from the phase weights."""
    from nvfp4train.data.config import parse_data_config
    from nvfp4train.data.prepare import prepare_all
    from nvfp4train.data.shards import read_manifest

    data = parse_data_config(cfg["data"])
    try:
        dirs = prepare_all(cfg["data"], splits=("train",), progress=False)
        available = {name.split("/")[0]: read_manifest(d)["n_tokens"] for name, d in dirs.items()}
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"data: {e}; carry {DATA_ARCHIVE} (made by `python -m nvfp4train.reproduce pack-data`) "
                         "or pass --data ARCHIVE") from None
    drawn = {name: 0.0 for name in data.sources}
    starts = [float(p.start) for p in data.phases] + [1.0]
    for i, phase in enumerate(data.phases):
        for name, weight in phase.weights.items():
            drawn[name] += float(weight) * (starts[i + 1] - starts[i]) * tokens
    return {name: drawn[name] / available[name] for name in drawn if available.get(name)}


def visible_gpus(args) -> list[int]:
    """The GPU indices to plan onto: --gpu-ids, else the first --gpus, else every visible one."""
    if args.device == "cpu":
        return []
    if args.gpu_ids is not None:
        return args.gpu_ids
    if args.gpus is not None:
        return list(range(args.gpus))
    import torch

    return list(range(torch.cuda.device_count()))


def existing_run(results: Path | None, job: Job) -> bool:
    return results is not None and (results / job.key / "metrics.jsonl").is_file()


def selected_arms(exp: Experiment, wanted: list[str] | None) -> list[str]:
    """The arms of `exp` to run: all, or those of --arms that it has."""
    return [a for a in (wanted or exp.arms) if a in exp.arms]


def check_arms(experiments: list[Experiment], wanted: list[str] | None) -> None:
    """Every arm named with --arms must belong to one of the experiments named."""
    for arm in wanted or []:
        if not any(arm in exp.arms for exp in experiments):
            allowed = sorted({a for exp in experiments for a in exp.arms})
            raise UsageError(f"arm {arm!r}: not an arm of {', '.join(e.name for e in experiments)}; "
                             f"allowed: {', '.join(allowed)}")


def plan(args) -> tuple[list[Job], list[str], dict]:
    """The runs to start (with their slots) and the notes to print (skips, totals)."""
    experiments = resolve_experiments(args.experiments, args.experiments_dir)
    unpacked = unpack_data(Path(args.data)) if args.data else False
    speeds = dict(ASSUMED_SPEED)
    for item in args.speed or []:
        fmt, _, value = item.partition("=")
        if fmt not in speeds or not value.replace("_", "").isdigit():
            raise UsageError(f"--speed {item!r}: expected FORMAT=TOKENS_PER_S with FORMAT one of {', '.join(speeds)}")
        speeds[fmt] = float(value)
    notes = [f"unpacked {args.data} into {SHARDS_DIR}/"] if unpacked else []
    jobs, info = [], {}
    for exp in experiments:
        arms = selected_arms(exp, args.arms)
        seeds = args.seeds or exp.seeds
        tokens = args.tokens or exp.tokens
        for arm_name in arms:
            arm = exp.arms[arm_name]
            device = ["train.device=cpu"] if args.device == "cpu" else []
            cfg = compose_arm(exp.base + arm.overrides + device)
            per_step = int(cfg["train"]["global_batch_size"]) * int(cfg["train"]["seq_len"])
            steps = max(1, round(tokens * arm.tokens_factor / per_step))
            fmt = cfg["precision"].get("format", "bf16")
            # GiB per run by its format; a run that switches to BF16 late takes the larger of the two
            formats = [fmt, "bf16"] if (cfg["precision"].get("switch") or {}).get("at_fraction") else [fmt]
            estimates = [exp.gib_per_run.get(f, exp.gib_per_run.get("default")) for f in formats]
            gib = None if None in estimates else max(estimates)
            if exp.name not in info:
                params, non_embedding = model_params(cfg["model"])
                info[exp.name] = {"params": params, "non_embedding": non_embedding, "per_step": per_step,
                                  "model": cfg["model"].get("name"), "cfg": cfg}
            for seed in seeds:
                out_dir = Path(args.runs_dir) / exp.name / arm_name / f"seed{seed}"
                overrides = exp.base + arm.overrides + device + [
                    f"train.max_steps={steps}", f"seed={seed}", f"experiment={exp.name}", f"out_dir={out_dir}",
                    "train.progress=false"]
                speed = CPU_SPEED if args.device == "cpu" else speeds.get(fmt, speeds["bf16"])
                eval_device = ["device=cpu"] if args.device == "cpu" else []
                eval_args = None if exp.eval is None else list(exp.eval) + eval_device
                jobs.append(Job(exp.name, arm_name, seed, overrides, eval_args, str(out_dir), steps, steps * per_step,
                                fmt, speed, arm.tokens_factor,
                                CPU_STARTUP_S if args.device == "cpu" else STARTUP_S, gib))
    keep = []
    for job in jobs:
        state = job_state(Path(job.out_dir))
        if existing_run(args.skip_existing, job) and not args.force:
            notes.append(f"skip {job.key}: already in {args.skip_existing} (--force runs it again)")
        elif state in ("running", "queued"):
            notes.append(f"skip {job.key}: {state} in {job.out_dir}")
        elif state == "done" and not args.force:
            notes.append(f"skip {job.key}: finished in {job.out_dir} (collect it; --force runs it again)")
        else:
            keep.append(job)
    return keep, notes, info


def assign_slots(jobs: list[Job], gpus: list[int], per_gpu: int, device: str) -> int:
    """Longest runs first, each onto the slot that frees up first. Returns the number of slots."""
    n_slots = max(len(gpus), 1) * per_gpu
    ends = [0.0] * n_slots
    for job in sorted(jobs, key=lambda j: -j.tokens / j.speed):
        slot = min(range(n_slots), key=lambda s: ends[s])
        job.slot, job.per_device = slot, per_gpu
        job.device = "cpu" if device == "cpu" else f"cuda:{gpus[slot % len(gpus)]}"
        ends[slot] += job.estimate_s()
    return n_slots


# How many runs share a GPU: each run's estimate (the experiment's gib_per_run: what one run of that precision
# takes of a GPU, as nvidia-smi shows it per process, CUDA context included) against the GPU's free memory
# less HEADROOM (allocator fragmentation, the evaluation after training, estimates being estimates). The runs
# that may train at once on a GPU are the largest of each of its slots' queues.
HEADROOM = 0.10


def gpu_budgets(gpus: list[int], args) -> dict[int, tuple[float, float]] | None:
    """GPU index -> (free GiB, GiB its runs may take); None where there is nothing to measure (CPU, no CUDA)."""
    if args.device == "cpu" or not gpus:
        return None
    if args.gpu_free_gib is not None:
        free = dict.fromkeys(gpus, float(args.gpu_free_gib))
    else:
        import torch

        if not torch.cuda.is_available():
            return None
        free = {g: torch.cuda.mem_get_info(g)[0] / 2**30 for g in gpus}
    return {g: (f, f * (1 - HEADROOM)) for g, f in free.items()}


def pack_slots(jobs: list[Job], budgets: dict[int, tuple[float, float]]) -> int:
    """--per-gpu auto. Largest estimate first (the longest first among equals), each run opens a slot of its
    own (a worker that starts it at once) on the GPU with the most memory left, while its estimate fits
    there; once none has room, it queues on the slot that frees up first. Every slot then holds as much
    memory as the largest run queued on it. Returns the number of slots."""
    left = {gpu: budget for gpu, (_, budget) in budgets.items()}
    slots: list[list] = []   # [gpu, estimated end in seconds]
    for job in sorted(jobs, key=lambda j: (-j.gib, -j.tokens / j.speed)):
        gpu = max(left, key=lambda g: left[g])
        if job.gib <= left[gpu]:
            left[gpu] -= job.gib
            slots.append([gpu, 0.0])
            job.slot = len(slots) - 1
        elif slots:
            job.slot = min(range(len(slots)), key=lambda i: slots[i][1])
        else:
            free, budget = budgets[gpu]
            raise UsageError(f"{job.key}: its estimate of {job.gib:g} GiB ({job.precision}, gib_per_run) does not fit "
                             f"any GPU: cuda:{gpu} has the most, {budget:.1f} GiB ({free:.1f} GiB free less "
                             f"{HEADROOM:.0%} headroom)")
        slots[job.slot][1] += job.tokens / job.speed + job.startup_s
        job.device = f"cuda:{slots[job.slot][0]}"
    for job in jobs:
        job.per_device = sum(gpu == slots[job.slot][0] for gpu, _ in slots)
    return len(slots)


def gpu_load(jobs: list[Job], gpu: int) -> list[Job]:
    """The largest run of each slot on `gpu`: what may train on it at once."""
    largest: dict[int, Job] = {}
    for job in jobs:
        if job.device == f"cuda:{gpu}" and (job.slot not in largest or job.gib > largest[job.slot].gib):
            largest[job.slot] = job
    return list(largest.values())


def check_memory(jobs: list[Job], budgets: dict[int, tuple[float, float]], per_gpu: int) -> None:
    """--per-gpu N: refuse when the runs that may train at once on a GPU need more than it has to give."""
    for gpu, (free, budget) in sorted(budgets.items()):
        load = gpu_load(jobs, gpu)
        need = sum(j.gib for j in load)
        if need > budget:
            parts: dict[tuple[str, float], int] = {}
            for j in load:
                parts[j.precision, j.gib] = parts.get((j.precision, j.gib), 0) + 1
            raise UsageError(f"--per-gpu {per_gpu}: cuda:{gpu} would train {len(load)} runs at once, "
                             + " + ".join(f"{n} x {gib:g} GiB ({fmt})" for (fmt, gib), n in sorted(parts.items()))
                             + f" = {need:.1f} GiB, more than its {budget:.1f} GiB ({free:.1f} GiB free less "
                             f"{HEADROOM:.0%} headroom); --per-gpu auto starts as many as fit")


def plan_slots(jobs: list[Job], gpus: list[int], args, notes: list[str]) -> tuple[int, dict | None]:
    """Slots for --per-gpu N or auto, checked against the GPUs' memory. Returns (slots, budgets or None)."""
    budgets = gpu_budgets(gpus, args)
    if budgets is not None and jobs:
        missing = sorted({(j.experiment, j.precision) for j in jobs if j.gib is None})
        if missing and args.per_gpu == "auto":
            exp, fmt = missing[0]
            raise UsageError(f"--per-gpu auto: experiment {exp} gives no memory estimate for precision {fmt}: add "
                             f"gib_per_run: {{{fmt}: GiB}} (or default) to {args.experiments_dir}/{exp}.yaml or "
                             "_common.yaml")
        if missing:
            notes.append("memory not checked: no gib_per_run estimate for "
                         + ", ".join(f"{exp} {fmt}" for exp, fmt in missing))
            budgets = None
    if args.per_gpu == "auto":
        if budgets is not None:
            return pack_slots(jobs, budgets), budgets
        if args.device != "cpu":
            notes.append("--per-gpu auto: no CUDA here to measure free memory, planning 1 run per GPU "
                         "(--gpu-free-gib GiB plans as on GPUs with that much free)")
        return assign_slots(jobs, gpus, 1, args.device), None
    n_slots = assign_slots(jobs, gpus, args.per_gpu, args.device)
    if budgets is not None:
        check_memory(jobs, budgets, args.per_gpu)
    return n_slots, budgets


def fit_tokens(jobs: list[Job], minutes: float, per_step_of: dict[str, int]) -> None:
    """Scale every run's tokens (keeping each arm's factor) so that the busiest slot ends within `minutes`."""
    by_slot: dict[int, list[Job]] = {}
    for job in jobs:
        by_slot.setdefault(job.slot, []).append(job)
    scale = min((minutes * 60 - sum(j.startup_s for j in js)) / sum(j.tokens / (j.speed / j.per_device) for j in js)
                for js in by_slot.values())
    if scale <= 0:
        raise UsageError(f"--budget-minutes {minutes}: less than the start-up time of the runs queued on one slot")
    base = {job.experiment: max(1, int(base_steps(job.max_steps, job.tokens_factor) * scale)) for job in jobs}
    for job in jobs:
        job.max_steps = max(1, round(base[job.experiment] * job.tokens_factor))
        job.tokens = job.max_steps * per_step_of[job.experiment]
        job.overrides = [f"train.max_steps={job.max_steps}" if o.startswith("train.max_steps=") else o
                         for o in job.overrides]


def print_plan(jobs: list[Job], notes: list[str], info: dict, n_slots: int, gpus: list[int], budgets: dict | None,
               args) -> None:
    for note in notes:
        print(note)
    where = "cpu" if args.device == "cpu" else f"{len(gpus)} GPU(s) ({','.join(map(str, gpus))})"
    print(f"plan: {len(jobs)} run(s) on {where}, {n_slots} slot(s) (--per-gpu {args.per_gpu}), "
          f"runs dir {args.runs_dir}")
    for gpu, (free, budget) in sorted((budgets or {}).items()):
        load = gpu_load(jobs, gpu)
        print(f"  cuda:{gpu}: {len(load)} run(s) at once, up to {sum(j.gib for j in load):.1f} GiB of its "
              f"{budget:.1f} ({free:.1f} GiB free less {HEADROOM:.0%} headroom)")
    for name, i in info.items():
        runs = [j for j in jobs if j.experiment == name]
        if not runs:
            continue
        tokens = base_steps(runs[0].max_steps, runs[0].tokens_factor) * i["per_step"]   # the 1x budget
        try:
            epochs = data_epochs(i["cfg"], tokens)
            passes = f"passes over the data per source {min(epochs.values()):.1f}-{max(epochs.values()):.1f}"
        except UsageError as e:
            passes = f"passes over the data unknown ({e})"
        print(f"  {name}: model {i['model']} {i['params'] / 1e6:.2f}M params ({i['non_embedding'] / 1e6:.2f}M without "
              f"embedding and LM head); {tokens:,} tokens per run = {tokens / i['non_embedding']:.1f} tokens/param "
              f"({tokens / i['params']:.1f} counting embeddings); {passes}")
    print(f"{'run':<44} {'device':<7} {'slot':>4} {'precision':<14} {'steps':>6} {'tokens':>12} {'est. min':>8} "
          f"{'GiB':>5}")
    slot_end: dict[int, float] = {}
    for job in sorted(jobs, key=lambda j: (j.slot, j.key)):
        slot_end[job.slot] = slot_end.get(job.slot, 0.0) + job.estimate_s()
        print(f"{job.key:<44} {job.device:<7} {job.slot:>4} {job.precision:<14} {job.max_steps:>6} "
              f"{job.tokens:>12,} {job.estimate_s() / 60:>8.1f} {'-' if job.gib is None else f'{job.gib:g}':>5}")
    if slot_end:
        print(f"estimated wall time: {max(slot_end.values()) / 60:.1f} min (assumed speeds; poll shows the "
              "measured ones, --speed FORMAT=TOKENS_PER_S corrects the estimate)")


# ---------------------------------------------------------------------------------------------- launch
def job_state(run_dir: Path) -> str | None:
    """None (never launched) | queued | running | done | failed | lost (its worker died mid-run)."""
    result_path, pid_path = run_dir / "run.json", run_dir / "worker.pid"
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        return "done" if result.get("train_rc") == 0 else "failed"
    if not (run_dir / "job.json").is_file():
        return None
    if not (pid_path.is_file() and pid_alive(pid_path.read_text().strip())):
        return "lost"
    return "running" if (run_dir / "started").is_file() else "queued"


def pid_alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie (an exited child nobody waited for yet) counts as gone
        return Path(f"/proc/{int(pid)}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


def base_steps(steps: int, factor: float) -> int:
    return round(steps / factor)


def check_budget(jobs: list[Job], results: Path | None, experiments_dir: Path) -> None:
    """Refuse to start runs whose token budget differs from the results already there: experiments
    configured with one budget (all that take _common.yaml's) share it, as borrowed arms are compared
    across them, and mixed budgets do not compare. An experiment configured with a budget of its own (a
    longer main comparison) is checked only against the experiments configured like it. The refusal names
    every run there of another budget."""
    if results is None or not results.is_dir():
        return
    import yaml

    factors, configured = {}, {}
    for name in experiment_names(experiments_dir):
        exp = load_experiment(name, experiments_dir)
        configured[name] = exp.tokens
        factors.update({(name, a): arm.tokens_factor for a, arm in exp.arms.items()})
    clashes, first, suggested = [], None, None
    for config_path in sorted(results.glob("*/*/seed*/config.yaml")):
        experiment, arm, seed = config_path.parts[-4:-1]
        train = (yaml.safe_load(config_path.read_text()) or {}).get("train", {})
        steps = int(train.get("max_steps", 0))
        per_step = int(train.get("global_batch_size", 0)) * int(train.get("seq_len", 0))
        there = base_steps(steps, factors.get((experiment, arm), 1.0))
        clash = next((j for j in jobs if j.tokens // j.max_steps == per_step
                      and configured.get(j.experiment) == configured.get(experiment)
                      and base_steps(j.max_steps, j.tokens_factor) != there), None)
        if clash is not None:
            clashes.append(f"{experiment}/{arm}/{seed} ({steps * per_step:,} tokens)")
            first, suggested = first or clash, suggested or there * per_step
    if clashes:
        planned = base_steps(first.max_steps, first.tokens_factor) * (first.tokens // first.max_steps)
        raise UsageError(f"{first.key} is planned at a budget of {planned:,} tokens, but {results} holds runs of "
                         f"another budget: {', '.join(clashes)}; runs of other budgets do not compare: pass --tokens "
                         f"{suggested} to match them, or --force to train the new budget anyway (`ingest --force` then "
                         "replaces each of them whose experiment/arm/seed it brings back)")


def launch(args) -> int:
    if args.per_gpu != "auto":
        if not args.per_gpu.isdigit() or int(args.per_gpu) < 1:
            raise UsageError(f"--per-gpu {args.per_gpu}: expected a number >= 1 or auto")
        args.per_gpu = int(args.per_gpu)
    if args.gpu_free_gib is not None and args.gpu_free_gib <= 0:
        raise UsageError(f"--gpu-free-gib {args.gpu_free_gib:g}: must be > 0")
    check_arms(resolve_experiments(args.experiments, args.experiments_dir), args.arms)  # bad names before any work
    gpus = visible_gpus(args)
    if args.device != "cpu" and not gpus:
        raise UsageError("no CUDA GPU visible (use --device cpu to run on the CPU)")
    jobs, notes, info = plan(args)
    n_slots, budgets = plan_slots(jobs, gpus, args, notes)
    if args.budget_minutes:
        fit_tokens(jobs, args.budget_minutes, {k: v["per_step"] for k, v in info.items()})
    if not args.force:
        check_budget(jobs, args.skip_existing, args.experiments_dir)
    print_plan(jobs, notes, info, n_slots, gpus, budgets, args)
    if args.dry_run or not jobs:
        print("dry run: nothing started" if args.dry_run else "nothing to start")
        return 0
    for i in info.values():  # the data must be here before anything starts
        data_epochs(i["cfg"], 1)
    if args.kernels and Path(args.kernels).is_file():  # before any run compiles: skip the autotuning
        added, root = unpack_kernel_cache(Path(args.kernels))
        print(f"kernel cache: {added} file(s) from {args.kernels} added to {root}")
    from nvfp4train.data.paths import git_commit

    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    commit = args.commit or git_commit()   # of the checkout launched from ("unknown" in a copy without .git)
    threads = max(1, (os.cpu_count() or 1) // n_slots)
    for slot in sorted({j.slot for j in jobs}):
        queue = sorted((j for j in jobs if j.slot == slot), key=lambda j: j.key)
        for job in queue:
            run_dir = Path(job.out_dir)
            if args.force and run_dir.exists():
                shutil.rmtree(run_dir)   # a fresh run (job_state refused running ones in plan)
            run_dir.mkdir(parents=True, exist_ok=True)
            for stale in ("run.json", "started", "worker.pid"):
                (run_dir / stale).unlink(missing_ok=True)
            (run_dir / "job.json").write_text(json.dumps({**job.__dict__, "commit": commit, "queued": time.time()},
                                                         indent=1) + "\n")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        if queue[0].device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = queue[0].device.split(":")[1]
        log = open(runs_dir / f"worker-slot{slot}.log", "a")
        command = [sys.executable, "-m", "nvfp4train.reproduce", "_worker"] + [j.out_dir for j in queue]
        worker = subprocess.Popen(command,
                                  cwd=os.getcwd(), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True)  # setsid: survives the command that launched it
        for job in queue:  # the worker writes the same file when it starts (whichever comes first)
            (Path(job.out_dir) / "worker.pid").write_text(str(worker.pid))
    print(f"started {len(jobs)} run(s) in {len({j.slot for j in jobs})} worker(s); "
          f"`python -m nvfp4train.reproduce poll --runs-dir {args.runs_dir}` shows progress")
    return 0


def gpu_name(device: str) -> str:
    if device == "cpu":
        return "cpu"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                              os.environ.get("CUDA_VISIBLE_DEVICES", "0")], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def worker(run_dirs: list[str]) -> int:
    """One slot's queue: train each run (resuming what a killed worker left), evaluate it, write run.json."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for run_dir in map(Path, run_dirs):
        (run_dir / "worker.pid").write_text(str(os.getpid()))
    for run_dir in map(Path, run_dirs):
        job = json.loads((run_dir / "job.json").read_text())
        started = time.time()
        (run_dir / "started").write_text(str(started))
        with open(run_dir / "console.log", "a") as console:
            train_rc = subprocess.call([sys.executable, "-m", "nvfp4train.train"] + job["overrides"],
                                       stdout=console, stderr=console, stdin=subprocess.DEVNULL)
            eval_rc = None
            if train_rc == 0 and job["eval"] is not None:
                eval_rc = subprocess.call([sys.executable, "-m", "nvfp4train.eval", f"run_dir={run_dir}"] + job["eval"],
                                          stdout=console, stderr=console, stdin=subprocess.DEVNULL)
        finished = time.time()
        try:  # recorded here, where the shards are, so that a report made elsewhere can say it
            import yaml

            passes = data_epochs(yaml.safe_load((run_dir / "config.yaml").read_text()), job["tokens"])
        except (UsageError, OSError, KeyError, ValueError):
            passes = None
        result = {"experiment": job["experiment"], "arm": job["arm"], "seed": job["seed"],
                  "overrides": job["overrides"], "eval_args": job["eval"], "commit": job["commit"],
                  "gpu": gpu_name(job["device"]), "runs_per_gpu": job["per_device"],
                  "torch": package_version("torch"), "python": sys.version.split()[0], "host": socket.gethostname(),
                  "started": started, "finished": finished, "wall_s": round(finished - started, 1),
                  "train_rc": train_rc, "eval_rc": eval_rc, "max_steps": job["max_steps"], "tokens": job["tokens"],
                  "data_passes": passes}
        (run_dir / "run.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------ poll
def find_jobs(runs_dir: Path) -> list[Path]:
    return sorted(p.parent for p in Path(runs_dir).glob("*/*/seed*/job.json"))


def last_records(run_dir: Path, n: int = 5) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines()[-50:]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("loss") is not None:
            records.append(record)
    return records[-n:]


def poll(args) -> int:
    print_table(args.runs_dir)
    return 0


def print_table(runs_dir: Path) -> None:
    """One line per run (and the last line of a failed or lost run's output), the runs per state."""
    run_dirs = find_jobs(runs_dir)
    if not run_dirs:
        print(f"no runs under {runs_dir}")
        return
    print(f"{'run':<44} {'state':<8} {'step':>11} {'tokens':>12} {'loss':>7} {'tok/s':>8} {'ETA min':>7}")
    counts: dict[str, int] = {}
    slot_eta: dict[int, float] = {}
    rows = []
    for run_dir in run_dirs:
        job = json.loads((run_dir / "job.json").read_text())
        state = job_state(run_dir)
        counts[state] = counts.get(state, 0) + 1
        records = last_records(run_dir)
        step = records[-1]["step"] if records else 0
        speed = sorted(r["tokens_per_s"] for r in records)[len(records) // 2] if records else None
        remaining = (job["max_steps"] - step) * job["tokens"] / job["max_steps"]
        eta = remaining / speed if speed and state in ("running", "queued", "lost") else None
        if state == "queued":
            eta = job["tokens"] / (job["speed"] / job["per_device"]) + job.get("startup_s", STARTUP_S)
        rows.append((job, run_dir, state, records, step, speed, eta))
    for job, run_dir, state, records, step, speed, eta in sorted(rows, key=lambda r: (r[0]["slot"], r[1])):
        if state in ("running", "queued") and eta is not None:
            slot_eta[job["slot"]] = slot_eta.get(job["slot"], 0.0) + eta
            eta = slot_eta[job["slot"]]
        loss = f"{records[-1]['loss']:.3f}" if records else "-"
        key = f"{job['experiment']}/{job['arm']}/seed{job['seed']}"
        progress = f"{step}/{job['max_steps']}"
        print(f"{key:<44} {state:<8} {progress:>11} "
              f"{step * job['tokens'] // job['max_steps']:>12,} {loss:>7} "
              f"{'-' if speed is None else f'{speed:,.0f}':>8} {'-' if eta is None else f'{eta / 60:.1f}':>7}")
        if state in ("failed", "lost"):
            tail = [line for line in (run_dir / "console.log").read_text().splitlines() if line.strip()] \
                if (run_dir / "console.log").is_file() else []
            print(f"    {tail[-1][:160] if tail else 'no output'}")
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    together: dict[str, list[float]] = {}
    for job, _, state, _, _, speed, _ in rows:
        if state == "running" and speed:
            together.setdefault(job["device"], []).append(speed)
    for device, speeds in sorted(together.items()):  # what --per-gpu is measured by
        print(f"{device}: {len(speeds)} running, {sum(speeds):,.0f} tokens/s together")


# ------------------------------------------------------------------------------------------------ wait
UNDER_WAY = ("running", "queued")


def wait(args) -> int:
    """Block until every run in the runs dir has ended (run.json written, or its worker gone), printing the
    table every --every seconds and once at the end: exit 0, or 1 when --timeout-s ran out first. One device
    command can then launch, wait and collect (the machine is given back soon after a command ends)."""
    for flag, value in (("--every", args.every), ("--timeout-s", args.timeout_s)):
        if value is not None and value <= 0:
            raise UsageError(f"wait: {flag} {value:g}: must be > 0 (seconds)")
    start = time.monotonic()
    last_table = start
    while True:
        elapsed = time.monotonic() - start
        under_way = sum(job_state(d) in UNDER_WAY for d in find_jobs(args.runs_dir))
        timed_out = args.timeout_s is not None and elapsed >= args.timeout_s
        if not under_way or timed_out or time.monotonic() - last_table >= args.every:
            print(f"--- wait: {elapsed:.0f} s", flush=True)
            print_table(args.runs_dir)
            sys.stdout.flush()
            last_table = time.monotonic()
        if not under_way:
            print("every run has ended")
            return 0
        if timed_out:
            print(f"wait: --timeout-s {args.timeout_s:g} ran out with {under_way} run(s) running or queued "
                  "(collect leaves them out)")
            return 1
        pause = min(5.0, args.every)
        if args.timeout_s is not None:
            pause = min(pause, max(args.timeout_s - elapsed, 0.0))
        time.sleep(pause)


# --------------------------------------------------------------------------------------------- collect
def collect(args) -> int:
    out = Path(args.out or os.environ.get("OUT") or "")
    if not str(out) or str(out) == ".":
        raise UsageError("collect: give --out DIR (or set $OUT)")
    out.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    packed, skipped = [], []
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        for run_dir in find_jobs(args.runs_dir):
            job = json.loads((run_dir / "job.json").read_text())
            key = f"{job['experiment']}/{job['arm']}/seed{job['seed']}"
            if args.experiment and job["experiment"] not in args.experiment:
                continue
            state = job_state(run_dir)
            if state != "done":
                skipped.append(f"left out {key}: " + unfinished_detail(run_dir, job, state))
                continue
            for name in COLLECTED:
                if (run_dir / name).is_file():
                    tar.add(run_dir / name, arcname=f"{key}/{name}")
            packed.append(key)
    if not packed:
        print(f"nothing finished to collect under {args.runs_dir}")
        for line in skipped:
            print(line)
        return 0
    if buffer.tell() > ARCHIVE_LIMIT:
        raise UsageError(f"collect: the archive would be {buffer.tell() / 2**20:.1f} MiB, over 16 MiB; collect fewer "
                         "experiments at a time (--experiment NAME)")
    path = out / f"repro-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
    path.write_bytes(buffer.getvalue())
    print(f"{path}: {len(packed)} run(s), {path.stat().st_size / 2**20:.2f} MiB")
    for key in packed:
        print(f"  {key}")
    for line in skipped:
        print(line)
    return 0


def unfinished_detail(run_dir: Path, job: dict, state: str) -> str:
    """Why a run is not collected, in a few words: how far it got, or how it ended."""
    if state == "failed":
        result = json.loads((run_dir / "run.json").read_text())
        return f"failed (training exited with {result.get('train_rc')}; its console.log says why)"
    records = last_records(run_dir, 1)
    step = records[-1]["step"] if records else 0
    gone = ", its worker is gone" if state == "lost" else ""
    return f"not finished ({state}{gone}, step {step}/{job['max_steps']})"


# ------------------------------------------------------------------------------------------- kernels
def pack_kernels(args) -> int:
    out = Path(args.out or os.environ.get("OUT") or "")
    if not str(out) or str(out) == ".":
        raise UsageError("pack-kernels: give --out DIR (or set $OUT)")
    path = out / KERNEL_ARCHIVE.name
    n, what = pack_kernel_cache(path, ARCHIVE_LIMIT)
    print(f"{path}: {n} file(s), {what}, {path.stat().st_size / 2**20:.2f} MiB "
          f"(carry it back as {KERNEL_ARCHIVE}: launch unpacks it)")
    return 0


def unpack_kernels(args) -> int:
    if not Path(args.archive).is_file():
        raise UsageError(f"{args.archive}: no such file")
    added, root = unpack_kernel_cache(Path(args.archive))
    print(f"kernel cache: {added} file(s) from {args.archive} added to {root}")
    return 0


# ---------------------------------------------------------------------------------------------- ingest
MEMBER = re.compile(r"^(?P<run>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/seed\d+)/(?P<file>"
                    + "|".join(map(re.escape, COLLECTED)) + ")$")


def ingest(args) -> int:
    archive = Path(args.archive)
    if not archive.is_file():
        raise UsageError(f"{archive}: no such archive (collect writes repro-<time>.tar.gz under $OUT)")
    try:
        tar = tarfile.open(archive)
        members = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UsageError(f"{archive}: not a readable tar archive ({e})") from None
    runs: dict[str, list[tarfile.TarInfo]] = {}
    for member in members:
        m = MEMBER.match(member.name)
        if not m or not member.isfile() or ".." in member.name.split("/"):
            raise UsageError(f"{archive}: unexpected member {member.name!r} (expected EXPERIMENT/ARM/seedK/"
                             f"{{{','.join(COLLECTED)}}})")
        runs.setdefault(m["run"], []).append(member)
    into = Path(args.into)
    added = 0
    for key, files in sorted(runs.items()):
        target = into / key
        if (target / "metrics.jsonl").is_file() and not args.force:
            print(f"skip {key}: already in {into} (--force replaces it)")
            continue
        # Unpacked beside it first, then swapped in whole: a replaced run keeps none of the old run's files
        # (an eval.json the new run lacks), and a failed unpack leaves the old run as it was.
        staging = target.with_name(target.name + ".ingesting")
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        for member in files:
            (staging / Path(member.name).name).write_bytes(tar.extractfile(member).read())
        replaced = target.exists()
        if replaced:
            shutil.rmtree(target)
        staging.rename(target)
        print(f"{'replaced' if replaced else 'added'} {key}")
        added += 1
    tar.close()
    print(f"{added} run(s) added to {into}, {len(runs) - added} skipped")
    return 0


# ---------------------------------------------------------------------------------------------- report
def report(args) -> int:
    from nvfp4train.reproduce.report import write_report

    path = write_report(Path(args.runs), Path(args.out), Path(args.experiments_dir), figures=not args.no_plots)
    print(f"wrote {path}")
    return 0


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m nvfp4train.reproduce", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiments-dir", type=Path, default=EXPERIMENTS_DIR, help="where the experiment files are")
    verbs = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("pack-data", help="token shards of the corpora -> one archive to carry")
    p.add_argument("--config", default="configs/data/corpora.yaml")
    p.add_argument("--out", default=str(DATA_ARCHIVE))

    p = verbs.add_parser("launch", help="plan and start runs in the background; returns at once")
    p.add_argument("experiments", nargs="+", help="experiment names (configs/reproduce/NAME.yaml) or `all`")
    p.add_argument("--arms", type=lambda s: s.split(","), help="comma-separated arms (default: all)")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], help="comma-separated seeds")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--gpus", type=int, help="use the first N GPUs (default: all visible)")
    p.add_argument("--gpu-ids", type=lambda s: [int(x) for x in s.split(",")], help="use these GPUs, e.g. 4,5,6,7")
    p.add_argument("--per-gpu", default="1", help="runs sharing one GPU at a time (default 1), or auto: as many as "
                   "fit its free memory by the experiment's gib_per_run (checked for N too)")
    p.add_argument("--gpu-free-gib", type=float, help="plan as on GPUs with this much free memory, instead of "
                   "asking them (a --dry-run planned away from the GPU machine)")
    p.add_argument("--tokens", type=int, help="training tokens per run (default: the experiment's)")
    p.add_argument("--budget-minutes", type=float, help="scale the tokens so that every run ends within this")
    p.add_argument("--speed", action="append", help="FORMAT=TOKENS_PER_S for the estimate (repeatable)")
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR))
    p.add_argument("--skip-existing", type=Path, help="skip runs already in this results dir (docs/results/runs)")
    p.add_argument("--force", action="store_true", help="run again what is there (results dir or runs dir)")
    p.add_argument("--data", default=str(DATA_ARCHIVE), help="shards archive to unpack when present")
    p.add_argument("--kernels", default=str(KERNEL_ARCHIVE), help="kernel cache archive (pack-kernels) "
                   "to unpack when present, so the runs skip mamba-ssm's autotuning")
    p.add_argument("--commit", help="the commit to record (default: git rev-parse HEAD, where .git exists)")
    p.add_argument("--dry-run", action="store_true", help="print the plan only")

    p = verbs.add_parser("poll", help="progress of every run")
    p.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS_DIR)

    p = verbs.add_parser("wait", help="until every run has ended: exit 0, or 1 when --timeout-s runs out")
    p.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS_DIR)
    p.add_argument("--timeout-s", type=float, help="give up after this many seconds (exit 1; default: no limit)")
    p.add_argument("--every", type=float, default=30, help="seconds between progress tables (default 30)")

    p = verbs.add_parser("collect", help="finished runs -> one archive under $OUT")
    p.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS_DIR)
    p.add_argument("--out", help="directory for the archive (default: $OUT)")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")

    p = verbs.add_parser("pack-kernels", help="this machine's Triton and Inductor caches -> $OUT/kernels.tar.gz")
    p.add_argument("--out", help="directory for the archive (default: $OUT)")

    p = verbs.add_parser("unpack-kernels", help="add a packed kernel cache to this machine's caches")
    p.add_argument("archive")

    p = verbs.add_parser("ingest", help="unpack a collected archive into the results")
    p.add_argument("archive")
    p.add_argument("--into", default=str(RESULTS_DIR / "runs"))
    p.add_argument("--force", action="store_true", help="replace runs already there")

    p = verbs.add_parser("report", help="docs/results/reproduction.md from the ingested runs")
    p.add_argument("--runs", default=str(RESULTS_DIR / "runs"))
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--no-plots", action="store_true")

    p = verbs.add_parser("_worker")   # internal: one slot's queue, started by launch
    p.add_argument("run_dirs", nargs="+")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    verbs = {"pack-data": pack_data, "launch": launch, "poll": poll, "wait": wait, "collect": collect,
             "ingest": ingest, "report": report, "pack-kernels": pack_kernels, "unpack-kernels": unpack_kernels}
    try:
        if args.verb == "_worker":
            return worker(args.run_dirs)
        return verbs[args.verb](args)
    except (UsageError, KernelCacheError) as e:  # bad input: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
