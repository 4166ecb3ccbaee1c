"""Checkpoints: sharded, atomic, keep-last-k, resumable, and never unpickling arbitrary objects.

Layout of one checkpoint, `<out_dir>/checkpoints/step_00000100/`:
  model_optim/            torch.distributed.checkpoint (DCP): model weights and AdamW moments, FP32,
                          each rank writing its own shards (FSDP2) or rank 0 the whole (DDP / single)
  rank_00000.pt           per-rank state: RNG states (torch, CUDA, stochastic-rounding generators),
                          data-loader position, precision-schedule state (tensors and plain data only)
  meta.json               step, tokens, world size, the model config it was written for, the
                          optimizer's param_groups, the W&B run id; written last

A save goes to `step_XXXXXXXX.tmp/` and is renamed into place when every rank has written, so a crash
mid-save leaves the previous checkpoint as the latest loadable one. Loading uses `weights_only=True`
for `torch.load` and a restricted unpickler for DCP's metadata file; non-tensor optimizer fields
travel in meta.json, so DCP never has to unpickle a Python object.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch

from nvfp4train.precision.layer import CONFIG_DERIVED_BUFFERS

log = logging.getLogger(__name__)
PREFIX = "step_"
META = "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for this run; the message names the file and the mismatch."""


# torch.distributed.checkpoint (and what it imports: DTensor, sympy) is imported where a checkpoint is read or
# written, not before a run's first step; its reader and planner classes are in train/dcp_reader.py.
def __getattr__(name: str):
    if name in ("SafeFileSystemReader", "_TensorsOnlyLoadPlanner"):
        from nvfp4train.train import dcp_reader

        return getattr(dcp_reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def _single_process_quiet():
    """A single process (no process group) is a supported DCP mode; DCP's warning about it is noise.
    Silenced around our own DCP calls only, not for the whole program."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


# ----------------------------------------------------------------------------------------- reading
# A checkpoint is data from disk, possibly from someone else: nothing in it may name code to run.
# DCP's `.metadata` is a plain pickle, so it gets an unpickler that resolves an explicit list of
# (module, name) pairs and nothing else. A dotted name is refused outright: pickle protocol 4+ walks
# "a.b.c" as attributes, so an allowed module would otherwise lead to everything it imports (`os`).
_DCP = "torch.distributed.checkpoint.metadata"
METADATA_GLOBALS = frozenset(
    {
        (_DCP, "Metadata"),
        (_DCP, "StorageMeta"),
        (_DCP, "MetadataIndex"),
        (_DCP, "TensorStorageMetadata"),
        (_DCP, "ChunkStorageMetadata"),
        (_DCP, "TensorProperties"),
        (_DCP, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # maps "torch.strided" to the layout object
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the classes DCP's `.metadata` file is made of (METADATA_GLOBALS and torch dtypes)."""

    def find_class(self, module, name):
        if "." not in name:
            if (module, name) in METADATA_GLOBALS:
                return super().find_class(module, name)
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which is not allowed in a checkpoint")


def _refused(path: Path, e: pickle.UnpicklingError) -> CheckpointError:
    """One line for torch's weights-only refusal, without its advice to switch the check off."""
    glob, op = re.search(r"GLOBAL ([\w.]+)", str(e)), re.search(r"Unsupported operand (\d+)", str(e))
    what = (
        f"it refers to {glob.group(1)}, which is not allowed in a checkpoint"
        if glob
        else f"it uses pickle opcode {int(op.group(1)):#x}, which a checkpoint never needs"
        if op
        else "it holds objects other than tensors and plain data"
    )
    return CheckpointError(f"{path}: refused ({what}); not loaded")


def load_weights_only(path: Path, map_location="cpu", safe_globals=()):
    """`torch.load(weights_only=True)` with a refusal as one line naming the file.

    PyTorch's own message for a refused global ends with the advice to load with weights_only=False;
    that is exactly what must not be done with a file from an unknown source, so it is not repeated.
    """
    try:
        with torch.serialization.safe_globals(list(safe_globals)), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the refusal below says it all
            return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} missing: the checkpoint is incomplete") from None
    except pickle.UnpicklingError as e:
        raise _refused(path, e) from None
    except Exception as e:  # truncated or garbage bytes
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: unreadable ({first}); not loaded") from None


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints (renamed into place, meta.json present), oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [
        p
        for p in ckpt_root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit() and (p / META).is_file()
    ]
    return sorted(found, key=step_of)


def step_of(ckpt: Path) -> int:
    return int(ckpt.name[len(PREFIX) :])


def remove_leftovers(ckpt_root: Path) -> None:
    """Remove what a kill during `prune` left behind (`<name>.deleting` directories)."""
    for leftover in ckpt_root.glob(f"{PREFIX}*.deleting"):
        shutil.rmtree(leftover, ignore_errors=True)


def is_healthy(ckpt: Path) -> bool:
    """False for a checkpoint written after a loss spike or a skipped step (meta.json `healthy`, set by the
    trainer): its weights may be on the way to divergence. Checkpoints without the field count as healthy."""
    try:
        return json.loads((ckpt / META).read_text()).get("healthy", True) is not False
    except (OSError, ValueError, AttributeError):
        return True


def last_healthy(checkpoints: list[Path]) -> Path | None:
    return next((p for p in reversed(checkpoints) if is_healthy(p)), None)


def prune(ckpt_root: Path, keep_last: int, newest: int) -> None:
    """Delete all but the `keep_last` newest checkpoints up to step `newest` (the one just written), and
    the newest healthy one: when the loss spikes or diverges, the checkpoints written since then may all be
    poisoned, and the last one before it is where a resume should start.

    A checkpoint is renamed to `<name>.deleting` before it is removed, so a kill during the removal
    never leaves a half-deleted directory that still looks complete; leftovers are removed here."""
    remove_leftovers(ckpt_root)
    timeline = [p for p in list_checkpoints(ckpt_root) if step_of(p) <= newest]
    kept = timeline[-keep_last:]
    if kept and not any(is_healthy(p) for p in kept):
        kept.append(last_healthy(timeline))
    for old in timeline:
        if old in kept:
            continue
        doomed = old.with_name(old.name + ".deleting")
        old.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)


# What every meta.json holds (save() writes more: the run's config, the W&B id, the optimizer's groups).
META_FIELDS = {"step": int, "world_size": int, "model_config": dict}
# Fields save() may write, checked when present (a hand-edited or foreign meta.json is one line, not a traceback).
OPTIONAL_META_FIELDS = {
    "tokens": (int,),
    "wandb_id": (str, type(None)),
    "run_config": (dict,),
    "engine": (str,),
    "param_groups": (list,),
    "healthy": (bool,),
    "identity": (dict,),  # train/identity.py checks its fields
    "cpu_threads": (int,),  # a CPU run's torch threads: its resume takes the same (the count changes bits)
}
# What every rank file holds (the trainer's save() writes it): the state each part restores from.
RANK_FIELDS = {"loader": dict, "precision": dict, "guard": dict, "spikes": dict, "rng_cpu": torch.Tensor}


def read_meta(ckpt: Path) -> dict:
    path = ckpt / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt}: not a checkpoint ({META} missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable ({e}); not loaded") from None
    _check_fields(path, meta, META_FIELDS)
    if meta["step"] < 0 or meta["world_size"] < 1:
        raise CheckpointError(
            f"{path}: step={meta['step']}, world_size={meta['world_size']} are not a checkpoint's; not loaded"
        )
    for name, kinds in OPTIONAL_META_FIELDS.items():
        if name in meta and (not isinstance(meta[name], kinds) or isinstance(meta[name], bool) and bool not in kinds):
            allowed = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise CheckpointError(
                f"{path}: field {name!r} is a {type(meta[name]).__name__}, expected {allowed}; not loaded"
            )
    if ckpt.name.startswith(PREFIX) and ckpt.name[len(PREFIX) :].isdigit() and step_of(ckpt) != meta["step"]:
        raise CheckpointError(
            f"{path}: records step {meta['step']}, but the directory is named for step "
            f"{step_of(ckpt)}: renamed or hand-edited, so it is not loaded; move it out of "
            f"{ckpt.parent} or pass train.resume=<another checkpoint>"
        )
    return meta


def _check_fields(path: Path, node, fields: dict) -> None:
    """One line for a file that parsed but is not what save() writes (hand-edited, foreign, damaged)."""
    if not isinstance(node, dict):
        raise CheckpointError(f"{path}: holds a {type(node).__name__}, not a mapping; not loaded")
    for name, kind in fields.items():
        if name not in node:
            raise CheckpointError(f"{path}: field {name!r} missing; not loaded")
        if not isinstance(node[name], kind) or isinstance(node[name], bool):
            raise CheckpointError(
                f"{path}: field {name!r} is a {type(node[name]).__name__}, expected {kind.__name__}; not loaded"
            )


def check_compatible(ckpt: Path, meta: dict, model_config: dict) -> None:
    """Refuse, before any step, a checkpoint written for another model."""
    saved = meta.get("model_config", {})
    diffs = [
        f"{k} ({saved.get(k)!r} in the checkpoint, {model_config.get(k)!r} now)"
        for k in sorted(set(saved) | set(model_config))
        if saved.get(k) != model_config.get(k) and k != "ssd_backend"
    ]
    if diffs:
        raise CheckpointError(f"{ckpt} was written for another model: " + "; ".join(diffs))


def load(ckpt: Path, engine, rank: int, model_config: dict) -> tuple[dict, dict]:
    """Restore the engine's model and optimizer in place; return (meta, this rank's trainer state)."""
    meta = read_meta(ckpt)
    check_compatible(ckpt, meta, model_config)
    world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if meta["world_size"] != world_size:  # decided from meta.json alike on every rank, before any collective
        raise CheckpointError(
            f"{ckpt} was written by {meta['world_size']} rank(s), this run has {world_size}: "
            "exact resume (per-rank RNG and data position) needs the same world size"
        )
    rank_file = ckpt / f"rank_{rank:05d}.pt"
    if not rank_file.is_file():
        raise CheckpointError(f"{rank_file} missing: the checkpoint is incomplete")
    trainer_state = load_weights_only(rank_file)  # checked before the weights are read
    _check_fields(rank_file, trainer_state, RANK_FIELDS)
    rng = trainer_state["rng_cpu"]
    if rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        raise CheckpointError(f"{rank_file}: rng_cpu is not a CPU generator state; not loaded")
    engine.load(ckpt, meta)
    return meta, trainer_state


# The data position save() writes (data/loader.py state_dict): each field's type and allowed range, checked
# before the loader reads it, so a crafted or damaged value is one line naming it.
LOADER_FIELDS = {
    "version": (str, None),
    "fingerprint": (dict, None),
    "consumed_samples": (int, 0),
    "microbatch": (int, 0),
    "global_batch_size": (int, 1),
    "micro_batch_size": (int, 1),
    "world_size": (int, 1),
    "source_samples": (dict, None),
}


def check_loader_state(rank_file: Path, loader: dict) -> None:
    def refuse(field: str, what: str):
        raise CheckpointError(f"{rank_file}: field 'loader.{field}' {what}; not loaded")

    for name, (kind, least) in LOADER_FIELDS.items():
        if name not in loader:
            refuse(name, "missing")
        value = loader[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            refuse(name, f"is a {type(value).__name__}, expected {kind.__name__}")
        if least is not None and value < least:
            refuse(name, f"is {value}, expected an integer >= {least}")
    per_step = loader["micro_batch_size"] * loader["world_size"]
    if loader["global_batch_size"] % per_step:
        refuse("global_batch_size", f"is {loader['global_batch_size']}, not a multiple of micro_batch_size x ranks")
    grad_accum = loader["global_batch_size"] // per_step
    if loader["microbatch"] >= grad_accum:
        refuse("microbatch", f"is {loader['microbatch']}, expected 0 to {grad_accum - 1} (micro-batches per step)")
    for name, n in loader["source_samples"].items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            refuse(f"source_samples.{name}", f"is {n!r}, expected an integer >= 0")


# ----------------------------------------------------------------------------------------- finiteness
# A checkpoint's tensors are data from disk: NaN or inf in them (a damaged or tampered file) would only
# show as a halt some steps later, with advice to resume from the same checkpoint. Every reader of
# weights (resume, eval, export, generate) checks them here, on load, and refuses in one line.
def first_nonfinite(named_tensors) -> str | None:
    """The name of the first floating-point tensor with a NaN or inf element (None: all finite)."""
    for name, t in named_tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            local = t.to_local() if hasattr(t, "to_local") else t
            if not bool(torch.isfinite(local).all()):
                return name
    return None


def check_finite(
    ckpt: Path, named_tensors, device=None, advice: str = "resume from an earlier checkpoint with train.resume=<path>"
) -> None:
    """Refuse `ckpt` in one line naming its first non-finite tensor. Under a process group every rank
    calls this with its own shards and all refuse together (one rank's refusal alone would leave the
    others waiting in the next collective)."""
    bad = first_nonfinite(named_tensors)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        flag = torch.tensor(int(bad is None), dtype=torch.int32, device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        if bool(flag) is False and bad is None:
            bad = "a tensor held by another rank"
    if bad is not None:
        raise CheckpointError(
            f"{ckpt}: {bad} holds NaN or inf values (damaged or tampered), so the checkpoint is not loaded; {advice}"
        )


def load_model_optim(ckpt: Path, model, optimizer, meta: dict) -> None:
    """The PyTorch engine's part: DCP shards of weights and AdamW moments, param_groups from meta.json."""
    if meta.get("engine", "torch") != "torch":
        raise CheckpointError(f"{ckpt} was written by the {meta['engine']} engine; use train.parallel=deepspeed")
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    if "param_groups" not in meta:
        raise CheckpointError(f"{ckpt / META}: field 'param_groups' missing; not loaded")
    check_param_groups(ckpt / META, meta["param_groups"], optim_sd["param_groups"])
    kept = _keep_config_derived_buffers(ckpt, model_sd)
    state = {"model": model_sd, "optim": optim_sd["state"]}
    _dcp_load(ckpt, state, "cannot load")
    if kept:
        log.info(
            "%s: %d stochastic-rounding seed / RHT sign buffer(s) (e.g. %s) are not in the checkpoint or have "
            "another size there (written before they were stored, or under another RHT size): each keeps the "
            "value this run's seed and precision config give it",
            ckpt,
            len(kept),
            kept[0],
        )
    # The moments and step counts come from the checkpoint; the hyperparameters (betas, eps, weight_decay)
    # stay those of this run's config, which a resume may change (train/resume_policy.py: optim).
    device = next((t.device for t in state["model"].values() if isinstance(t, torch.Tensor)), None)
    check_finite(ckpt, _named_model_optim(state), device)
    optim_sd = {"state": state["optim"], "param_groups": optim_sd["param_groups"]}
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=optim_sd)


def _named_model_optim(state: dict):
    """(name, tensor) for the weights and then the AdamW moments of a loaded model_optim state."""
    yield from state["model"].items()
    for fqn, moments in state["optim"].items():
        for key, t in moments.items():
            yield f"optimizer state {fqn}.{key}", t


def _keep_config_derived_buffers(ckpt: Path, model_sd: dict) -> list[str]:
    """Take out of `model_sd` (what DCP is asked to load) the precision linears' seed and sign buffers that
    `ckpt` lacks or stores in another shape; the layers keep their own (PrecisionLinear._load_from_state_dict)."""
    names = [k for k in model_sd if k.rpartition(".")[2] in CONFIG_DERIVED_BUFFERS]
    if not names:
        return []
    from nvfp4train.train.dcp_reader import SafeFileSystemReader

    stored = SafeFileSystemReader(str(ckpt / "model_optim")).read_metadata().state_dict_metadata
    kept = [
        k for k in names if f"model.{k}" not in stored or tuple(stored[f"model.{k}"].size) != tuple(model_sd[k].shape)
    ]
    for k in kept:
        del model_sd[k]
    return kept


def load_model_tensors(ckpt: Path, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model weights of a PyTorch-engine checkpoint as full-size tensors shaped like `template`
    (a model's `state_dict()`), without a process group: DCP reshards on load, so the shards of any
    number of FSDP2 ranks fill them. The optimizer moments stay on disk. Refusals are one line."""
    state = {"model": {k: torch.empty_like(v) for k, v in template.items()}}
    _dcp_load(ckpt, state, "cannot load the model weights")
    return state["model"]


def _dcp_load(ckpt: Path, state: dict, failing: str) -> None:
    """dcp.load of `ckpt/model_optim` into `state` (tensors only), every failure one CheckpointError line
    (`failing` says what could not be done)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    from nvfp4train.train.dcp_reader import SafeFileSystemReader, _TensorsOnlyLoadPlanner

    reader = SafeFileSystemReader(str(ckpt / "model_optim"))
    reader.read_metadata()  # refused here in one line: inside dcp.load it is logged with two tracebacks first
    try:
        with _single_process_quiet(), _dcp_metadata_warnings_quiet():
            dcp.load(state, storage_reader=reader, planner=_TensorsOnlyLoadPlanner())
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # DCP wraps per-rank failures in a traceback text
        for failure in getattr(e, "failures", {}).values():
            if isinstance(failure[0], CheckpointError):  # ours, raised inside DCP: already one line
                raise CheckpointError(str(failure[0])) from None
            if isinstance(failure[0], pickle.UnpicklingError):  # a data file torch.load refused
                raise _refused(ckpt / "model_optim", failure[0]) from None
        lines = [ln.strip() for ln in str(e).splitlines() if "Error" in ln] or [str(e).strip()]
        raise CheckpointError(f"{ckpt / 'model_optim'}: {failing} ({lines[-1][:400]})") from None


@contextlib.contextmanager
def _dcp_metadata_warnings_quiet():
    """dcp.load logs a failed metadata read with its traceback on the root logger before raising; the
    refusal that follows is the one line the user needs (a second guard behind the read above)."""

    def drop(record: logging.LogRecord) -> bool:
        return "metadata is not found" not in str(record.msg)

    root = logging.getLogger()
    root.addFilter(drop)
    try:
        with warnings.catch_warnings():  # a planted pickle's protocol: the refusal that follows says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            yield
    finally:
        root.removeFilter(drop)


def check_param_groups(path: Path, saved, current: list[dict]) -> None:
    """The optimizer groups meta.json records must be this model's, as save() wrote them: the same groups
    of the same parameters, and hyperparameters AdamW accepts. One line naming the field otherwise."""

    def refuse(where: str, what: str):
        raise CheckpointError(
            f"{path}: param_groups{where} {what}; not loaded (written by another model or edited by hand)"
        )

    if not isinstance(saved, list) or not all(isinstance(g, dict) for g in saved):
        refuse("", "is not a list of groups")
    if len(saved) != len(current):
        refuse("", f"has {len(saved)} group(s), this model's optimizer has {len(current)}")
    for i, (group, ours) in enumerate(zip(saved, current)):
        if group.get("params") != list(ours["params"]):
            refuse(
                f"[{i}].params",
                f"differs from this model's group {i} ({ours.get('group', '')}: {len(ours['params'])} parameters)",
            )
        for key, ok, allowed in (
            ("lr", lambda v: v >= 0, ">= 0"),
            ("eps", lambda v: v > 0, "> 0"),
            ("weight_decay", lambda v: v >= 0, ">= 0"),
        ):
            v = group.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not ok(v):
                refuse(f"[{i}].{key}", f"is {v!r}, expected a finite number {allowed}")
        betas = group.get("betas")
        if not (
            isinstance(betas, list)
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)
        ):
            refuse(f"[{i}].betas", f"is {betas!r}, expected two numbers in [0, 1)")


# ----------------------------------------------------------------------------------------- writing
def save(
    ckpt_root: Path,
    step: int,
    engine,
    rank: int,
    world_size: int,
    meta: dict,
    trainer_state: dict,
    keep_last: int,
    barrier,
) -> Path:
    """Write a checkpoint for `step` atomically (all ranks call this); return its final path."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    final = ckpt_root / f"{PREFIX}{step:08d}"
    tmp = ckpt_root / f"{final.name}.tmp"
    if rank == 0:
        if tmp.is_symlink() or tmp.is_file():  # our own temporary name: remove the link itself, never its target
            tmp.unlink()
        elif tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    try:
        engine_meta = engine.save(tmp)
        torch.save(trainer_state, tmp / f"rank_{rank:05d}.pt")
    except (OSError, CheckpointException) as e:
        raise _write_failed(ckpt_root, tmp, e) from None
    barrier()
    if rank == 0:
        meta = dict(meta, **engine_meta, step=step, world_size=world_size)
        try:
            (tmp / META).write_text(json.dumps(meta, indent=1))
        except OSError as e:
            raise _write_failed(ckpt_root, tmp, e) from None
        if final.exists():  # re-saving the same step (e.g. final save right after a periodic one)
            doomed = final.with_name(final.name + ".deleting")
            final.rename(doomed)
            tmp.rename(final)
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            tmp.rename(final)
        prune(ckpt_root, keep_last, newest=step)
    barrier()
    return final


def _write_failed(ckpt_root: Path, tmp: Path, e: BaseException) -> CheckpointError:
    """Remove the partial save; one line saying why and what is still there to resume from."""
    causes = [f[0] for f in getattr(e, "failures", {}).values()] or [e]  # DCP wraps per-rank errors
    why = next((c.strerror for c in causes if isinstance(c, OSError) and c.strerror), None) or str(causes[0])[:200]
    if "inline_container" in why:  # torch.save's zip writer hides the OS error behind its own assertion
        why = "a write stopped part-way: disk full, quota or file-size limit"
    shutil.rmtree(tmp, ignore_errors=True)
    done = list_checkpoints(ckpt_root)
    kept = f"{done[-1]} is intact" if done else "no earlier checkpoint exists"
    return CheckpointError(f"{tmp.with_suffix('')}: cannot write the checkpoint ({why}); {kept}")


def tensors_are_finite(tensors) -> torch.Tensor:
    """One device-side bool for "every element of every tensor is finite" (no host sync here)."""
    flags = [
        torch.isfinite(t.to_local() if hasattr(t, "to_local") else t).all()
        for t in tensors
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    if not flags:
        return torch.tensor(True)
    device = next((f.device for f in flags if f.device.type != "cpu"), flags[0].device)
    # AdamW keeps its `step` counters on the CPU next to CUDA moments: gather the flags on one device
    return torch.stack([f.to(device, non_blocking=True) for f in flags]).all()


def save_model_optim(tmp: Path, model, optimizer) -> dict:
    """The PyTorch engine's part (all ranks): tensors to DCP, the optimizer's plain fields to meta."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    for fqn, st in optim_sd["state"].items():
        for k, v in st.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"optimizer state {fqn}.{k} is not a tensor ({type(v).__name__})")
    with _single_process_quiet():
        dcp.save({"model": model_sd, "optim": optim_sd["state"]}, checkpoint_id=str(tmp / "model_optim"))
    return {"engine": "torch", "param_groups": _groups_to_json(optim_sd["param_groups"])}


def _groups_to_json(groups: list[dict]) -> list[dict]:
    out = []
    for g in groups:
        g = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
        for k, v in g.items():
            if isinstance(v, torch.Tensor):
                g[k] = v.item()
        out.append(g)
    return out
