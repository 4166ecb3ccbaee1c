"""What a resume may change: one table, checked before anything heavy is loaded.

A checkpoint continues one run. Some keys may change on resume because they are legitimate
experiments or only bookkeeping (they are named in the log); the rest would make the continued run a
different run than the one the checkpoint belongs to, so the resume is refused with one line naming
the key, its old and new value and what may change.

Keys are dotted paths into RunConfig.to_dict(); a rule for a section ("precision") covers every key
under it. The most specific rule wins.
"""

from __future__ import annotations

from nvfp4train.config.schema import ConfigError
from nvfp4train.precision.recipe import recorded_run_config

NOTE, QUIET, REFUSE = "note", "quiet", "refuse"

POLICY: dict[str, tuple[str, str]] = {
    # legitimate experiments: allowed, and each change gets a line in the log
    "train.max_steps": (
        NOTE,
        "the LR and precision schedules are recomputed for the new length; blend phases "
        "already reached keep their start, later ones move to their fraction of it",
    ),
    "precision": (NOTE, "a precision switch on resume; the weights and optimizer state carry over"),
    "optim": (NOTE, "the optimizer carries its AdamW moments over; the new values apply from this step"),
    "train.micro_batch_size": (NOTE, "gradient accumulation changes; the global batch stays"),
    "train.parallel": (NOTE, "the checkpoint is resharded for the new parallelism"),
    "train.hsdp_shard_size": (NOTE, "the checkpoint is resharded for the new parallelism"),
    "train.zero_stage": (NOTE, "the checkpoint is resharded for the new ZeRO stage"),
    "train.eval_precision": (NOTE, "the evaluations from here on; the earlier ones stay as they were measured"),
    "train.max_nonfinite_steps": (NOTE, ""),
    "train.spike_factor": (NOTE, ""),
    # bookkeeping: allowed silently
    "train.log_every": (QUIET, ""),
    "train.eval_every": (QUIET, ""),
    "train.eval_sequences": (QUIET, ""),
    "train.save_every": (QUIET, ""),
    "train.keep_last": (QUIET, ""),
    "train.resume": (QUIET, ""),
    "train.overwrite": (QUIET, ""),
    "train.resume_foreign": (QUIET, ""),
    "train.device": (QUIET, ""),
    "train.compile": (QUIET, ""),
    "train.progress": (QUIET, ""),
    "train.profile_start": (QUIET, ""),
    "train.profile_steps": (QUIET, ""),
    "train.wandb": (QUIET, ""),
    "out_dir": (QUIET, ""),
    "experiment": (QUIET, ""),
    "train.activation_checkpointing": (QUIET, ""),
    "train.preempt_check_every": (QUIET, ""),
    "train.fsdp_reshard_after_forward": (QUIET, ""),
    "model.ssd_backend": (QUIET, ""),  # a kernel choice: the same weights
    # a different run: refused
    "seed": (REFUSE, "the seed fixes the data order and stochastic rounding"),
    "train.seq_len": (REFUSE, "the data stream is cut into samples of seq_len tokens"),
    "train.global_batch_size": (REFUSE, "the data stream is dealt out in global batches"),
    "data": (REFUSE, "the checkpoint's data position belongs to this data config"),
    "model": (QUIET, ""),  # refused by checkpoint.check_compatible, which names every differing key
}
ALLOWED = (
    "train.max_steps, precision, optim, train.micro_batch_size (same global batch), parallelism, "
    "logging/eval/save intervals, keep_last, device, compile, progress, wandb, out_dir"
)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key != "precision.modules":  # its patterns hold dots: one key, whole
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _shown(key: str, value):
    """A value as a resume note shows it: precision.modules by each pattern's preset name, not all its keys."""
    if key == "precision.modules" and isinstance(value, dict):
        return {p: m.get("name") or m.get("format", "bf16") if isinstance(m, dict) else m for p, m in value.items()}
    return value


def rule_for(key: str) -> tuple[str, str]:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        rule = POLICY.get(".".join(parts[:n]))
        if rule is not None:
            return rule
    return NOTE, ""  # a key this table does not know yet: allowed, but said


def check(old: dict, new: dict, ckpt) -> list[str]:
    """Raise ConfigError for the first refused change; return one log line per noted change."""
    old_flat, new_flat = _flatten(recorded_run_config(old)), _flatten(new)  # an older run's record: today's keys
    notes = []
    for key in sorted(set(old_flat) | set(new_flat)):
        before, after = old_flat.get(key), new_flat.get(key)
        if before == after or (key == "precision.modules" and not before and not after):  # a record from before it
            continue
        kind, why = rule_for(key)
        if kind == REFUSE:
            raise ConfigError(
                f"{key}={after!r} differs from {before!r} in the run being resumed ({ckpt}); "
                f"{why}, so it cannot change on resume. Allowed to change: {ALLOWED}; or start "
                "a new run in another out_dir"
            )
        if kind == NOTE:
            before, after = _shown(key, before), _shown(key, after)
            notes.append(f"resume changes {key}: {before!r} -> {after!r}" + (f" ({why})" if why else ""))
    return notes
