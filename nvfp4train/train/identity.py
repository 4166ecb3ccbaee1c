"""A run's identity, so that a checkpoint of another run is not continued as this one without a word.

A run gets a random id at its first start; every checkpoint's meta.json records it with the run's seed and
a hash of its model config (`identity`), and a resume carries it on. A checkpoint is this run's when its
identity is the one the other checkpoints in out_dir/checkpoints record: a checkpoint copied in from
another run (another seed, or another model of the same shapes) is refused in one line unless
`train.resume=<path> train.resume_foreign=true` says to continue from it. Resuming into an out_dir with no
checkpoints of its own (another parallelism, a copied run) continues the checkpoint's run. Checkpoints
written before identities were recorded are accepted with a note.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from nvfp4train.train import checkpoint

FIELDS = {"run_id": str, "seed": int, "model": str}


def new_run_id() -> str:
    return uuid.uuid4().hex


def model_hash(model_config: dict) -> str:
    """The model config's hash, without the kernel choice (ssd_backend gives the same weights)."""
    kept = {k: v for k, v in model_config.items() if k != "ssd_backend"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def of(run_id: str, cfg) -> dict:
    """The identity a checkpoint of this run records."""
    return {"run_id": run_id, "seed": cfg.seed, "model": model_hash(cfg.model.to_dict())}


def read(ckpt: Path) -> dict | None:
    """The identity `ckpt`'s meta.json records (None: written before identities were)."""
    meta = checkpoint.read_meta(ckpt)
    found = meta.get("identity")
    if found is None:
        return None
    path = Path(ckpt) / checkpoint.META
    for name, kind in FIELDS.items():
        if not isinstance(found.get(name), kind) or isinstance(found.get(name), bool):
            raise checkpoint.CheckpointError(
                f"{path}: field 'identity.{name}' is {found.get(name)!r}, expected a {kind.__name__}; not loaded"
            )
    return found


def _timeline(ckpt: Path, ckpt_root: Path) -> tuple[Path, dict] | None:
    """The newest other checkpoint of out_dir/checkpoints that records an identity, and that identity."""
    for other in reversed(checkpoint.list_checkpoints(ckpt_root)):
        if other.resolve() == Path(ckpt).resolve():
            continue
        try:
            found = read(other)
        except checkpoint.CheckpointError:  # a damaged one is not evidence either way
            continue
        if found is not None:
            return other, found
    return None


def check(ckpt: Path, ckpt_root: Path, foreign_ok: bool) -> tuple[str, str | None]:
    """(the run id this run continues with, a line for the log or None); refuses another run's checkpoint."""
    theirs = read(ckpt)
    own = _timeline(ckpt, ckpt_root)
    if theirs is None:
        note = f"{ckpt}: records no run identity (written before identities were recorded); resumed as this run's"
        return (own[1]["run_id"] if own else new_run_id()), note
    if own is None:
        return theirs["run_id"], None
    where, ours = own
    differ = [f"{k} {theirs[k]!r} ({where.name}: {ours[k]!r})" for k in FIELDS if theirs[k] != ours[k]]
    if not differ:
        return theirs["run_id"], None
    if not foreign_ok:
        raise checkpoint.CheckpointError(
            f"{ckpt} belongs to another run than the checkpoints in {ckpt_root}: {'; '.join(differ)}; "
            "pass train.resume_foreign=true to continue this run from it anyway, or name a checkpoint of this run"
        )
    differ = "; ".join(differ)
    return ours["run_id"], f"{ckpt}: a checkpoint of another run ({differ}), continued (train.resume_foreign=true)"
