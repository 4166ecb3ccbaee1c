"""Kept for old command lines: the same as `python -m nvfp4train.compare` (see its --help).

    python scripts/compare_runs.py runs/exp/bf16 runs/exp/nvfp4 --baseline runs/exp/bf16 --out runs/exp/compare
"""
import sys

from nvfp4train.compare.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
