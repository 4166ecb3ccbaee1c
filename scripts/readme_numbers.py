"""Regenerate the README's measured numbers for the default run, so they stay true.

    python scripts/readme_numbers.py            # runs `python -m nvfp4train.train` afresh, rewrites README.md
    python scripts/readme_numbers.py --dry-run  # print the block instead

Runs the README's default training command (every default, a fresh out_dir in a temporary directory),
reads its metrics.jsonl and rewrites the text between the `readme-numbers` markers in README.md: wall
clock, loss from the first to the last step, tokens/s (median over logged steps) and held-out losses.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- readme-numbers: begin (python scripts/readme_numbers.py) -->", "<!-- readme-numbers: end -->"


def measure() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "default"
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "nvfp4train.train", f"out_dir={out}", "train.progress=false"],
            cwd=REPO,
            check=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("loss") is not None]
    first, last = steps[0], steps[-1]
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in steps[1:] or steps)
    val = {k[len("val/") :]: v for k, v in last.items() if k.startswith("val/") and k != "val/mean"}
    date = datetime.date.today().isoformat()
    return (
        f"- The default run, `python -m nvfp4train.train` ({date}, {os.cpu_count()} CPU cores, "
        f"{platform.machine()}, torch {_torch_version()}): {wall / 60:.0f} min {wall % 60:.0f} s wall clock; "
        f"loss {first['loss']:.3f} → {last['loss']:.3f} in {last['step']} steps at about "
        f"{tokens_per_s:,.0f} tokens/s, held-out loss {' / '.join(f'{v:.3f}' for v in val.values())} on "
        f"{' / '.join(val)}."
    )


def _torch_version() -> str:
    import torch

    return torch.__version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the block, leave README.md alone")
    args = parser.parse_args()
    block = measure()
    if args.dry_run:
        print(block)
        return
    readme = REPO / "README.md"
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), flags=re.S)
    if not pattern.search(text):
        sys.exit(f"error: README.md has no block between {BEGIN!r} and {END!r}")
    readme.write_text(pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text))
    print(block)


if __name__ == "__main__":
    main()
