"""Compare training runs: loss against tokens, relative loss to a baseline, gaps at milestones, seeds,
stability, downstream results; PNG + markdown + JSON, and optionally a W&B run.

    python -m nvfp4train.compare runs/exp/bf16 runs/exp/nvfp4 --baseline runs/exp/bf16 --out runs/exp/compare
"""

from nvfp4train.compare.analysis import compare
from nvfp4train.compare.runs import Arm, Run, group_runs, load_run, markers

__all__ = ["compare", "Arm", "Run", "group_runs", "load_run", "markers"]
