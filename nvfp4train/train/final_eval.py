"""train.final_eval: the final checkpoint's evaluation in the training process.

`python -m nvfp4train.eval run_dir=<out_dir> ...` after training starts a second process, which imports torch,
starts CUDA and loads the kernels again; here the same evaluation (`nvfp4train.eval.evaluate`, the same
eval.json, bit for bit: it loads the checkpoint from disk as that command does) runs in the process that
trained. Its options are checked before training starts, so that a typo does not surface after the run.
"""

from __future__ import annotations

import json
import os

from nvfp4train.config import ConfigError, RunConfig


def world_size_from_env() -> int:
    """The ranks of this job as torchrun or srun launch them (1 for a plain process)."""
    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)


def check(cfg: RunConfig) -> None:
    """Refuse, before training, what the final evaluation could not do: several ranks, an unknown task, a task
    whose data is missing."""
    final = cfg.train.final_eval
    if not final.enabled:
        return
    ranks = world_size_from_env()
    if ranks > 1:
        raise ConfigError(
            f"train.final_eval.enabled=true: the final evaluation runs in a run of one process, this one has "
            f"{ranks} ranks; leave it out and evaluate afterwards: python -m nvfp4train.eval run_dir={cfg.out_dir}"
        )
    from nvfp4train.eval import harness
    from nvfp4train.eval.weights import RunError

    try:
        definitions = harness.load_task_definitions()
        for name in harness.select_tasks(final.tasks, definitions):
            harness.read_items(definitions[name])
    except RunError as e:  # "tasks: unknown task ..." or a task file that is missing
        text = str(e)
        raise ConfigError(
            f"train.final_eval.{text}" if text.startswith("tasks:") else f"train.final_eval.tasks: {text}"
        ) from None


def is_done(cfg: RunConfig) -> bool:
    """Whether out_dir/eval.json already holds this evaluation of the final checkpoint (a finished run started
    again evaluates only where it is missing)."""
    path = cfg.out_dir / "eval.json"
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    final = cfg.train.final_eval
    return (
        result.get("step") == cfg.train.max_steps
        and result.get("eval_precision") == str(final.eval_precision)
        and result.get("heldout_sequences") == final.heldout_sequences
    )


def evaluate_final(cfg: RunConfig) -> None:
    """Evaluate the checkpoint of train.max_steps as `python -m nvfp4train.eval` would with train.final_eval's
    options, write out_dir/eval.json and print its lines; a RunError (e.g. a checkpoint that cannot be
    read) propagates for the caller to report."""
    from nvfp4train.config.commands import EvalConfig
    from nvfp4train.eval.__main__ import evaluate, print_result, progress

    final = cfg.train.final_eval
    eval_cfg = EvalConfig(
        run_dir=cfg.out_dir,
        step=cfg.train.max_steps,
        tasks=final.tasks,
        heldout_sequences=final.heldout_sequences,
        max_items=final.max_items,
        batch_size=final.batch_size,
        device=cfg.train.device,
        eval_precision=final.eval_precision,
    )
    progress(f"the final checkpoint (step {cfg.train.max_steps}) in this process (train.final_eval)")
    result, path = evaluate(eval_cfg)
    print_result(result, path)
