"""The scaled-down reproduction of arXiv 2509.25149: `python -m nvfp4train.reproduce VERB` (runner.py has the
verbs and the experiment files' format; report.py writes docs/results/reproduction.md)."""
