"""`python -m nvfp4train.launch`: torchrun with one-line failures (nvfp4train/launch/torchrun.py)."""

from nvfp4train.launch.torchrun import main

main()
