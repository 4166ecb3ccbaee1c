"""Compare runs from their metrics.jsonl: loss relative to a baseline, throughput, stability.

    python scripts/compare_runs.py runs/exp/bf16 runs/exp/fp8_blockwise runs/exp/nvfp4 [--baseline runs/exp/bf16]

Relative loss follows the paper's convention magnitude: (run - baseline) / baseline, in percent, on the
steps both runs logged (positive = worse than the baseline). Prints one table row per run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def load(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        sys.exit(f"error: {path} not found (expected the out_dir of a run)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(records: list[dict], baseline: dict[int, float] | None, skip_first: int) -> dict:
    losses = {r["step"]: r["loss"] for r in records if r.get("loss") is not None}   # null: a skipped step
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > skip_first]
    last = records[-1]
    row = {"steps": max(losses) if losses else 0, "final_loss": losses[max(losses)] if losses else math.nan,
           "tokens_per_s": sum(speeds) / len(speeds) if speeds else math.nan,
           "skipped": last.get("skipped_steps", 0), "spikes": last.get("loss_spikes", 0),
           "val_mean": next((r["val/mean"] for r in reversed(records) if "val/mean" in r), math.nan)}
    if baseline:
        common = sorted(set(losses) & set(baseline))
        rel = [(losses[s] - baseline[s]) / baseline[s] * 100 for s in common]
        row["max_abs_diff"] = max((abs(losses[s] - baseline[s]) for s in common), default=math.nan)
        row["rel_final_%"] = rel[-1] if rel else math.nan
        tail = rel[-max(len(rel) // 10, 1):]
        row["rel_last10%_%"] = sum(tail) / len(tail) if tail else math.nan
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--baseline", type=Path, help="run to compare against (default: the first)")
    ap.add_argument("--skip-first", type=int, default=3, help="steps left out of the throughput mean (warm-up)")
    args = ap.parse_args()
    base_dir = args.baseline or args.runs[0]
    baseline = {r["step"]: r["loss"] for r in load(base_dir) if r.get("loss") is not None}
    rows = [(str(run), summarize(load(run), baseline, args.skip_first)) for run in args.runs]
    cols = ["steps", "final_loss", "val_mean", "rel_final_%", "rel_last10%_%", "max_abs_diff", "tokens_per_s",
            "skipped", "spikes"]
    width = max(len(name) for name, _ in rows)
    print(f"baseline: {base_dir}")
    print(f"{'run':<{width}}  " + "  ".join(f"{c:>13}" for c in cols))
    for name, row in rows:
        cells = []
        for c in cols:
            v = row.get(c, math.nan)
            cells.append(f"{v:>13.4f}" if isinstance(v, float) else f"{v:>13}")
        print(f"{name:<{width}}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
