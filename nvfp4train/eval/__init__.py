"""Evaluate and load trained checkpoints: held-out loss per data source, offline zero-shot tasks.

python -m nvfp4train.eval run_dir=runs/default [step=N] [tasks=wiki_next_sentence,arithmetic]

from nvfp4train.eval import load_run_model
model, run_config, ckpt = load_run_model("runs/default")
"""

from nvfp4train.eval.weights import RunError, find_checkpoint, load_run_model, read_run_config

__all__ = ["RunError", "find_checkpoint", "load_run_model", "read_run_config"]
