"""A run directory as `compare`, `reproduce report` / `status` and `eval` read it: one reader for its files.

    config.yaml        the resolved config the trainer wrote                       read_config
    metrics.jsonl      one JSON record per logged step (metrics.jsonl.gz when      read_metrics
                       `reproduce copy-results` committed it)
    eval.json          the BF16 evaluation of a checkpoint (python -m nvfp4train.eval)   read_eval
    run.json           the executor's record of an attempt (python -m nvfp4train.reproduce) read_run_info

A run directory may come from someone else (a copied result, an unpacked tarball), so nothing in it is
trusted: only regular files are opened (a FIFO or a link to /dev/zero would hang or fill memory), every
file is read up to a size cap, YAML is read with the safe loader and its expansion (aliases) is bounded,
and a metrics line is read up to a length cap. Whatever is wrong ends in one `RunError` line naming the
file (and field) and what is allowed. A damaged metrics line (torn by a kill, edited, a lone surrogate, a
nesting no record has) costs only itself: it is left out and counted, and the caller names it.

`finished_run` is the one rule for "this run is done" that `reproduce report` and `reproduce status`
share. Nothing here imports torch.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
METRICS_GZ = "metrics.jsonl.gz"  # how `reproduce copy-results` commits metrics: a tenth of the size
EVAL = "eval.json"
RUN_INFO = "run.json"

# Caps far above what the trainer, the evaluator and the executor write (a config.yaml is a few KB and a
# few hundred values, a metrics record under 40 KB, eval.json and run.json a few KB) and far below what
# would fill a machine's memory or keep a command busy for minutes.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000  # counted with YAML aliases expanded, as every reader of the dict sees them
MAX_JSON_BYTES = 16 << 20  # eval.json, run.json
MAX_METRICS_LINE_BYTES = 1 << 20
MAX_METRICS_BYTES = 512 << 20  # decompressed
MAX_METRICS_LINES = 5_000_000
DAMAGED_NAMED = 100  # damaged metrics lines kept by number (all are counted)

TEXT_FIELDS = ("precision_switch",)  # the one metrics field that holds text; the others are numbers or null
# The trainer's decisions (train/plan.py's RunPlan): config.yaml's last section, and `resolved/<decision>` fields
# (text among them: the device, the backends) of the first metrics record a process writes. Not part of the
# run's config: runs that differ only there are the same run made on other machines.
RESOLVED = "resolved"
RESOLVED_PREFIX = RESOLVED + "/"
CONFIG_SECTIONS = ("model", "precision", "data", "optim", "train")  # mappings wherever present


class RunError(ValueError):
    """A run directory, checkpoint or option that cannot be used; the message is one line."""


# ------------------------------------------------------------------------------------------- files
def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path):
    """`path` opened for binary reading, or one line if it is not a regular file (a FIFO is never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    except OSError as e:
        raise RunError(f"{path}: unreadable ({e.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RunError(f"{path}: is {_kind(mode)}; a run directory's files must be regular files")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RunError(f"{path}: larger than {limit:,} bytes; not a file a run writes")
    return data


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunError(f"{path}: not UTF-8 text (byte {e.start})") from None


# ------------------------------------------------------------------------------------------ config
def _count_values(value, path: Path) -> None:
    """Refuse a tree of more than MAX_CONFIG_VALUES values, aliases expanded (a "billion laughs" file is a
    few lines that expand to billions); stops counting at the cap, so a bomb costs no more than the cap."""
    seen, stack = 0, [value]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise RunError(
                f"{path}: expands to more than {MAX_CONFIG_VALUES:,} values (YAML aliases?); a run's config.yaml "
                "holds a few hundred"
            )
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def read_config(run_dir: Path, required: dict[str, tuple[str, ...]] | None = None) -> dict:
    """The resolved config a run wrote (`config.yaml`): a mapping with a `model` mapping, and every section
    of CONFIG_SECTIONS that is present a mapping. `required`: {section: keys it must hold} beyond `model`."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    if not run_dir.is_dir():
        raise RunError(f"run_dir={str(run_dir)!r}: no such directory")
    if not os.path.lexists(path):
        raise RunError(f"{path} not found: {run_dir} is not the out_dir of a training run")
    text = _text(path, read_capped(path, MAX_CONFIG_BYTES))
    try:
        config = yaml.safe_load(text)  # plain values only: no tag builds an object or runs code
    except yaml.YAMLError as e:
        raise RunError(f"{path}: unreadable YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise RunError(f"{path}: nested too deeply; not a training run's config") from None
    _count_values(config, path)
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise RunError(f"{path}: has no `model` mapping; not a training run's config")
    for section in CONFIG_SECTIONS:
        if section in config and not isinstance(config[section], dict):
            raise RunError(
                f"{path}: `{section}` is a {type(config[section]).__name__}, not a mapping; not a training run's config"
            )
    for section, keys in (required or {}).items():
        if not isinstance(config.get(section), dict):
            raise RunError(f"{path}: has no `{section}` section; not a complete training run's config")
        missing = [k for k in keys if k not in config[section]]
        if missing:
            raise RunError(f"{path}: `{section}` has no `{missing[0]}`; not a complete training run's config")
    return config


# ----------------------------------------------------------------------------------------- metrics
def metrics_file(run_dir: Path) -> Path | None:
    """metrics.jsonl where it exists (whatever it is: `read_metrics` says so if it is no file), else the
    committed metrics.jsonl.gz, else None."""
    for name in (METRICS, METRICS_GZ):
        if os.path.lexists(Path(run_dir) / name):
            return Path(run_dir) / name
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")  # a lone surrogate ("\ud800") decodes from JSON but can never be written out
    except UnicodeEncodeError:
        return False
    return True


def is_record(record) -> bool:
    """A metrics record as the trainer writes it: a flat object, an integer step, integer tokens, numbers,
    booleans or null elsewhere (text only in TEXT_FIELDS)."""
    if not isinstance(record, dict) or not _int(record.get("step")):
        return False
    if "tokens" in record and not _int(record["tokens"]):
        return False
    return all(
        _encodable(k)
        and (
            v is None
            or isinstance(v, (int, float))
            or ((k in TEXT_FIELDS or k.startswith(RESOLVED_PREFIX)) and isinstance(v, str) and _encodable(v))
        )
        for k, v in record.items()
    )


def parse_line(line: bytes) -> dict | None:
    """One metrics line as a record, or None if damaged."""
    try:
        record = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # RecursionError: a nesting no record has
        return None
    return record if is_record(record) else None


@dataclass
class Metrics:
    path: Path
    records: list[dict]
    damaged: list[int] = field(default_factory=list)  # line numbers of the first DAMAGED_NAMED damaged lines
    damaged_count: int = 0

    @property
    def damaged_names(self) -> list[str]:
        """ "<file>:<line>" of the damaged lines kept by number."""
        return [f"{self.path}:{n}" for n in self.damaged]

    def last(self, key: str = "loss") -> dict | None:
        """The last record with a numeric `key`."""
        return next((r for r in reversed(self.records) if _number(r.get(key))), None)


def _lines(f, path: Path):
    """(number, line) of a binary stream, each line at most MAX_METRICS_LINE_BYTES, the stream at most
    MAX_METRICS_BYTES and MAX_METRICS_LINES lines."""
    total = 0
    for number in range(1, MAX_METRICS_LINES + 2):
        line = f.readline(MAX_METRICS_LINE_BYTES + 1)
        if not line:
            return
        if number > MAX_METRICS_LINES:
            raise RunError(f"{path}: more than {MAX_METRICS_LINES:,} lines; not metrics a run writes")
        if len(line) > MAX_METRICS_LINE_BYTES:
            raise RunError(
                f"{path}: line {number} is longer than {MAX_METRICS_LINE_BYTES:,} bytes; a metrics record is a few KB"
            )
        total += len(line)
        if total > MAX_METRICS_BYTES:
            raise RunError(f"{path}: more than {MAX_METRICS_BYTES:,} bytes of metrics; not metrics a run writes")
        yield number, line


def read_metrics(run_dir: Path) -> Metrics:
    """The records of metrics.jsonl (or metrics.jsonl.gz): every intact line, the damaged ones counted."""
    path = metrics_file(run_dir)
    if path is None:
        raise RunError(f"{Path(run_dir) / METRICS} not found: the run has logged no metrics yet")
    out = Metrics(path, [])
    with open_regular(path) as raw:
        try:
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if path.name == METRICS_GZ else raw
            for number, line in _lines(stream, path):
                if not line.strip():
                    continue
                record = parse_line(line)
                if record is None:
                    out.damaged_count += 1
                    if len(out.damaged) < DAMAGED_NAMED:
                        out.damaged.append(number)
                else:
                    out.records.append(record)
        except (OSError, EOFError, zlib.error) as e:  # gzip's BadGzipFile is an OSError
            raise RunError(f"{path}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    return out


# ----------------------------------------------------------------------------------- eval.json, run.json
def read_json(path: Path):
    """A JSON file of at most MAX_JSON_BYTES, None where there is none."""
    if not os.path.lexists(path):
        return None
    text = _text(path, read_capped(path, MAX_JSON_BYTES))
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RunError(f"{path}: not a JSON file ({str(e).splitlines()[0][:100]})") from None


def _finite(value) -> bool:
    return _number(value) and math.isfinite(value)


def check_eval(path: Path, evaluation, complete: bool = False) -> dict:
    """eval.json as `python -m nvfp4train.eval` writes it, in the parts the readers use; `complete`: also
    the summary that `reproduce report` reads (`heldout_mean_loss`, a non-empty `heldout`)."""

    def refuse(what: str):
        raise RunError(
            f"{path}: {what}; not an evaluation written by python -m nvfp4train.eval (run it again or remove the file)"
        )

    if not isinstance(evaluation, dict):
        refuse(f"holds a {type(evaluation).__name__}, not a JSON object")
    for section in ("tasks", "heldout", "heldout_tp"):
        if not isinstance(evaluation.get(section, {}), dict):
            refuse(f"field {section!r} is not a mapping")
    for task, v in evaluation.get("tasks", {}).items():
        if not (isinstance(v, dict) and isinstance(v.get("primary"), str) and _finite(v.get(v["primary"]))):
            refuse(f"tasks.{task} has no finite number under its `primary` metric")
    for section in ("heldout", "heldout_tp"):
        for source, v in evaluation.get(section, {}).items():
            if not (isinstance(v, dict) and _finite(v.get("loss"))):
                refuse(f"{section}.{source} has no finite `loss`")
            if "tokens" in v and not (_int(v["tokens"]) and v["tokens"] >= 0):
                refuse(f"{section}.{source}.tokens is not a count")
    for key, ok, allowed in (
        ("step", lambda v: _int(v) and v >= 0, "a step number"),
        ("tokens", lambda v: v is None or (_int(v) and v >= 0), "a token count or null"),
        ("max_len", lambda v: v is None or (_int(v) and v > 0), "a positive length"),
        ("heldout_sequences", lambda v: _int(v) and v >= 0, "a count"),
        ("heldout_mean_loss", _finite, "a finite number"),
        ("heldout_tp_mean_loss", _finite, "a finite number"),
    ):
        if key in evaluation and not ok(evaluation[key]):
            refuse(f"field {key!r} is {evaluation[key]!r}, not {allowed}")
    if complete:
        if "heldout_mean_loss" not in evaluation:
            refuse("field 'heldout_mean_loss' missing")
        if not evaluation.get("heldout"):
            refuse("field 'heldout' is empty")
    return evaluation


def read_eval(run_dir: Path, complete: bool = False) -> dict | None:
    """The run's eval.json, checked (`check_eval`), or None where there is none."""
    path = Path(run_dir) / EVAL
    evaluation = read_json(path)
    return None if evaluation is None else check_eval(path, evaluation, complete)


# run.json keys and what each must be (the executor writes them; older records lack some)
_RUN_INFO_FIELDS = {
    "state": (lambda v: v in ("done", "failed", "interrupted"), "done, failed or interrupted"),
    "train_rc": (lambda v: v is None or _int(v), "an exit code or null"),
    "eval_rc": (lambda v: v is None or _int(v), "an exit code or null"),
    "max_steps": (lambda v: _int(v) and v > 0, "a positive step count"),
    "tokens": (lambda v: _int(v) and v > 0, "a positive token count"),
    "seed": (_int, "an integer"),
    "gpus": (lambda v: _int(v) and v > 0, "a positive count"),
    "runs_per_gpu": (lambda v: _int(v) and v > 0, "a positive count"),
    "attempts": (lambda v: _int(v) and v > 0, "a positive count"),
    "deterministic": (lambda v: isinstance(v, bool), "true or false"),
    "wall_s": (lambda v: _finite(v) and v >= 0, "a finite number of seconds"),
    "started": (_finite, "a finite time"),
    "finished": (_finite, "a finite time"),
    **{k: (lambda v: isinstance(v, str), "text") for k in ("experiment", "arm", "commit", "gpu", "host", "torch")},
    "corpus": (
        lambda v: v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in (*v, *v.values()))),
        "null or a mapping of source/split to a hash",
    ),
}


def read_run_info(run_dir: Path) -> dict | None:
    """The run's run.json, checked field by field, or None where there is none."""
    path = Path(run_dir) / RUN_INFO
    info = read_json(path)
    if info is None:
        return None
    if not isinstance(info, dict):
        raise RunError(f"{path}: holds a {type(info).__name__}, not a JSON object; not a record of the executor")
    for key, (ok, allowed) in _RUN_INFO_FIELDS.items():
        if key in info and not ok(info[key]):
            raise RunError(f"{path}: field {key!r} is {info[key]!r}, not {allowed}")
    if "state" not in info and "train_rc" not in info:
        raise RunError(f"{path}: has neither `state` nor `train_rc`; not a record of the executor")
    return info


def recorded_state(info: dict | None) -> str | None:
    """done | failed | interrupted as run.json says, None without one."""
    if info is None:
        return None
    if "state" not in info:  # run.json of runs recorded before states existed: finished or failed
        return "done" if info.get("train_rc") == 0 else "failed"
    return info["state"]


# -------------------------------------------------------------------------------------- a finished run
@dataclass
class FinishedRun:
    path: Path
    config: dict
    metrics: Metrics
    info: dict
    eval: dict | None


def finished_run(run_dir: Path) -> FinishedRun | None:
    """The run if it is done, else None: run.json says done and its metrics reach train.max_steps. A run
    whose files disagree about that (run.json says done, the metrics stop early; eval.json or run.json of
    another step or budget) is refused in one line naming the file and field."""
    run_dir = Path(run_dir)
    info = read_run_info(run_dir)
    if recorded_state(info) != "done":
        return None
    config = read_config(run_dir, required={"train": ("max_steps", "global_batch_size", "seq_len")})
    train = config["train"]
    for key in ("max_steps", "global_batch_size", "seq_len"):
        if not (_int(train[key]) and train[key] > 0):
            raise RunError(f"{run_dir / CONFIG}: train.{key} is {train[key]!r}, not a positive integer")
    max_steps = train["max_steps"]
    budget = max_steps * train["global_batch_size"] * train["seq_len"]
    metrics = read_metrics(run_dir)
    last = metrics.last("loss")
    where = run_dir / RUN_INFO
    if last is None:
        raise RunError(f"{metrics.path}: no record with a training loss, yet {where} says the run is done")
    if last["step"] != max_steps:
        raise RunError(
            f"{where}: says done, but the last training loss in {metrics.path.name} is at step {last['step']} "
            f"of train.max_steps={max_steps}"
        )
    for key, expected in (("max_steps", max_steps), ("tokens", budget)):
        if key in info and info[key] != expected:
            raise RunError(f"{where}: field {key!r} is {info[key]}, but {CONFIG} gives {expected}")
    if "tokens" in last and last["tokens"] != budget:
        raise RunError(
            f"{metrics.path}: step {max_steps} is at {last['tokens']} tokens, but {CONFIG} gives {budget} "
            "(train.max_steps x global_batch_size x seq_len)"
        )
    evaluation = read_eval(run_dir, complete=True)
    if evaluation is not None:
        if evaluation.get("step", max_steps) != max_steps:
            raise RunError(
                f"{run_dir / EVAL}: field 'step' is {evaluation['step']}, but the run ended at step {max_steps}; "
                "evaluate the final checkpoint (python -m nvfp4train.eval) or remove the file"
            )
        if evaluation.get("tokens") is not None and evaluation["tokens"] != last.get("tokens", evaluation["tokens"]):
            raise RunError(
                f"{run_dir / EVAL}: field 'tokens' is {evaluation['tokens']}, but the run's step {max_steps} is at "
                f"{last['tokens']} tokens"
            )
    return FinishedRun(run_dir, config, metrics, info, evaluation)
