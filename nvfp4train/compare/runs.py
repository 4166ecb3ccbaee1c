"""Runs to compare: read from run directories or W&B, grouped into arms, checked for comparability.

A run is its resolved config (`config.yaml`, or the W&B run's config, which the trainer logs from the
same dict), its metrics records (`metrics.jsonl`, or the W&B history) and, when present, its
`eval.json`. Runs whose config differs only in `seed` and `out_dir` (by default) are seeds of one arm.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from nvfp4train import runs as rundir
from nvfp4train.precision.recipe import recorded_run_config
from nvfp4train.runs import RunError

WANDB_PREFIX = "wandb:"
# train.cuda_graph replays the eager step's numerics: runs that differ only there are seeds of one arm
DEFAULT_UNGROUPED = ("seed", "out_dir", "train.cuda_graph")
# Config keys that must agree between compared runs (unless --allow-mismatch): the data, the model and
# the token budget. Settings that change how data is read but not what is read are left out.
DATA_KEYS_IGNORED = ("data.cache_dir", "data.num_proc", "data.verify_checksums")
MODEL_KEYS_IGNORED = ("model.ssd_backend", "model.name")


@dataclass
class Run:
    name: str  # short name for legends: the directory name or the W&B run id
    source: str  # the directory or wandb:ENTITY/PROJECT/RUN_ID given on the command line
    config: dict
    records: list[dict]
    eval: dict | None = None
    flat: dict = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # damaged metrics lines left out, "<file>:<line>" (the first)
    skipped_count: int = 0  # all damaged metrics lines left out

    def __post_init__(self):
        self.config = recorded_run_config(self.config)  # a record written before a key was renamed: today's key
        self.flat = flatten({k: v for k, v in self.config.items() if k != rundir.RESOLVED})  # decisions, not config


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become their JSON text so they compare and print as one value."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = json.dumps(value, sort_keys=True) if isinstance(value, list) else value
    return out


def load_local(path: Path) -> Run:
    """A run directory through the one reader of run directories (`nvfp4train.runs`)."""
    path = Path(path)
    config = rundir.read_config(path)
    metrics = rundir.read_metrics(path)
    if metrics.last("loss") is None:
        raise RunError(f"{metrics.path}: no record with a training loss")
    return Run(
        name=path.resolve().name,
        source=str(path),
        config=config,
        records=metrics.records,
        eval=rundir.read_eval(path),
        skipped=metrics.damaged_names,
        skipped_count=metrics.damaged_count,
    )


def import_wandb(what: str):
    """The wandb module, or one line naming the extra that brings it."""
    try:
        import wandb
    except ImportError:
        raise RunError(f"{what} needs the wandb package: pip install 'nvfp4train[wandb]'") from None
    return wandb


def load_wandb(spec: str) -> Run:
    """`wandb:ENTITY/PROJECT/RUN_ID` through the W&B public API (needs an API key and the network)."""
    run_path = spec[len(WANDB_PREFIX) :]
    if run_path.count("/") != 2 or not all(run_path.split("/")):
        raise RunError(f"{spec}: expected wandb:ENTITY/PROJECT/RUN_ID")
    wandb = import_wandb(f"{spec}: reading a W&B run")
    if not (os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").is_file()):
        raise RunError(f"{spec}: reading W&B runs needs an API key (set WANDB_API_KEY or run `wandb login`)")

    try:
        remote = wandb.Api().run(run_path)
        records = [{("step" if k == "_step" else k): v for k, v in row.items()} for row in remote.scan_history()]
    except Exception as e:  # network, permissions, no such run: the API's message says which
        raise RunError(f"{spec}: cannot read the run from W&B ({str(e).splitlines()[0][:200]})") from None
    config = {k: v for k, v in dict(remote.config).items() if not k.startswith("_")}
    if not isinstance(config.get("model"), dict):
        raise RunError(f"{spec}: its config has no `model` mapping; not an nvfp4train run")
    if not any("loss" in r for r in records):
        raise RunError(f"{spec}: no history row with a training loss")
    return Run(name=run_path.split("/")[-1], source=spec, config=config, records=records)


def load_run(source: str) -> Run:
    return load_wandb(source) if str(source).startswith(WANDB_PREFIX) else load_local(Path(source))


# ------------------------------------------------------------------------------ comparability
def budget(run: Run) -> int | None:
    t = run.config.get("train", {})
    try:
        return int(t["max_steps"]) * int(t["global_batch_size"]) * int(t["seq_len"])
    except (KeyError, TypeError, ValueError):
        return None


def _short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_comparable(runs: list[Run]) -> None:
    """Refuse runs trained on other data, another model or another token budget than the first."""
    ref = runs[0]
    for run in runs[1:]:
        for section, ignored in (("data", DATA_KEYS_IGNORED), ("model", MODEL_KEYS_IGNORED)):
            keys = sorted(k for k in set(ref.flat) | set(run.flat) if k.startswith(section + ".") and k not in ignored)
            for key in keys:
                if ref.flat.get(key) != run.flat.get(key):
                    raise RunError(
                        f"{run.source} and {ref.source} differ in {key} ({_short(run.flat.get(key))} "
                        f"vs {_short(ref.flat.get(key))}): not the same {section}; pass --allow-mismatch "
                        "to compare anyway"
                    )
        if budget(run) != budget(ref):
            raise RunError(
                f"{run.source} and {ref.source} differ in token budget (train.max_steps x "
                f"global_batch_size x seq_len: {budget(run)} vs {budget(ref)}); pass --allow-mismatch "
                "to compare anyway"
            )


# ------------------------------------------------------------------------------ arms
@dataclass
class Arm:
    label: str
    runs: list[Run]
    key: dict  # the values of the config keys that tell this arm from the others


def group_runs(runs: list[Run], group_by: list[str] | None) -> list[Arm]:
    """Runs that agree on the grouping keys form one arm (their seeds). Without `group_by`, every key but
    seed and out_dir groups; arms are labelled by the keys whose values tell them apart."""

    def key_of(run: Run) -> dict:
        if group_by:
            return {k: run.flat.get(k) for k in group_by}
        return {k: v for k, v in run.flat.items() if k not in DEFAULT_UNGROUPED}

    if group_by:
        known = set().union(*(r.flat for r in runs))
        unknown = [k for k in group_by if k not in known]
        if unknown:
            raise RunError(f"--group-by {unknown[0]}: no run's config has this key (e.g. precision.name, seed)")
    groups: list[tuple[dict, list[Run]]] = []
    for run in runs:
        key = key_of(run)
        for existing, members in groups:
            if existing == key:
                members.append(run)
                break
        else:
            groups.append((key, [run]))
    all_keys = sorted(set().union(*(k for k, _ in groups)))
    differing = [k for k in all_keys if len({json.dumps(g.get(k), default=str) for g, _ in groups}) > 1]
    labels = []
    for key, members in groups:
        if len(groups) == 1:
            label = members[0].config.get("precision", {}).get("name") or members[0].name
        elif "precision.name" in differing and len({g.get("precision.name") for g, _ in groups}) == len(groups):
            label = str(key["precision.name"])
        else:
            label = ", ".join(f"{k}={key.get(k)}" for k in differing[:3]) or members[0].name
        labels.append(label)
    for i, label in enumerate(labels):  # two arms must never share a legend entry
        if labels.count(label) > 1:
            labels[i] = f"{label} [{groups[i][1][0].name}]"
    return [Arm(label, members, {k: key.get(k) for k in differing}) for label, (key, members) in zip(labels, groups)]


# ------------------------------------------------------------------------------ schedule markers
def markers(config: dict) -> list[dict]:
    """Token counts where the run's data blend switches phase and where the learning rate starts to decay
    (computed from the config exactly as the loader and `nvfp4train.optim.lr_at` do)."""
    t, optim = config.get("train", {}), config.get("optim", {})
    try:
        steps, per_step = int(t["max_steps"]), int(t["global_batch_size"]) * int(t["seq_len"])
    except (KeyError, TypeError, ValueError):
        return []
    total = steps * per_step
    out = []
    for i, phase in enumerate(config.get("data", {}).get("phases") or []):
        if float(phase.get("start", 0)) > 0:
            out.append({"kind": "phase", "label": f"data phase {i}", "tokens": float(phase["start"]) * total})
    schedule = optim.get("schedule", {}) or {}
    warmup = int(schedule.get("warmup_steps", 0) or 0)
    if schedule.get("name") == "wsd":
        decay_steps = max(int(round(float(schedule.get("decay_fraction", 0)) * steps)), 0)
        if decay_steps:
            out.append({"kind": "decay", "label": "LR decay", "tokens": max(steps - decay_steps, warmup) * per_step})
    elif schedule.get("name") == "cosine" and warmup:
        out.append({"kind": "decay", "label": "LR decay", "tokens": warmup * per_step})
    switch = (config.get("precision", {}).get("switch") or {}).get("at_fraction")
    if switch is not None:
        out.append({"kind": "switch", "label": "switch to BF16", "tokens": float(switch) * total})
    out = [m for m in out if 0 < m["tokens"] < total]  # e.g. a decay that would start after the last step
    out.append({"kind": "end", "label": "end of run", "tokens": total})
    return sorted(out, key=lambda m: m["tokens"])
