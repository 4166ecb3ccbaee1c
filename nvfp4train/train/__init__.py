"""Training: the loop, checkpoints, metrics and guards. Entry point: `python -m nvfp4train.train`."""
