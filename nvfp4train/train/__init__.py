"""Training: the loop and its Trainer, checkpoints, metrics and guards. Entry point: `python -m nvfp4train.train`."""
