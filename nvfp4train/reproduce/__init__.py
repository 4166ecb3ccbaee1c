"""The scaled-down reproduction of arXiv 2509.25149: `python -m nvfp4train.reproduce VERB` (__main__.py).
experiments.py reads the experiment files, plan.py turns them into runs and commands, executors.py runs
them (locally or as a SLURM array), stats.py holds the paired statistics and report.py writes the report."""
