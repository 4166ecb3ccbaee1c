"""`python -m nvfp4train.compare RUN... --baseline RUN --out DIR`: compare training runs like the paper.

RUN is a training run's out_dir, or `wandb:ENTITY/PROJECT/RUN_ID` (with a W&B API key). Writes to
--out: loss.png (training loss smoothed, held-out loss as points), relative_loss.png ((arm - baseline)
/ baseline in %, data-phase switches and the LR-decay start marked), stability.png (gradient norms,
tokens/s), compare.md and compare.json (every number the markdown shows). Runs sharing their config
except `seed` and `out_dir` (or the --group-by keys) are seeds of one arm: mean curve, min-max band,
and each gap checked against the baseline's seed-to-seed spread. With eval.json in the run directories
(python -m nvfp4train.eval), the arms' downstream results are tabulated side by side. --wandb logs the
comparison as one run in the arms' W&B group (online with a key, else offline). Runs trained on other
data, another model or another token budget are refused unless --allow-mismatch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from nvfp4train.compare import analysis, report
from nvfp4train.compare.runs import WANDB_PREFIX, check_comparable, group_runs, import_wandb, load_run, markers
from nvfp4train.runs import RunError


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m nvfp4train.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", help="run directories or wandb:ENTITY/PROJECT/RUN_ID")
    ap.add_argument("--baseline", help="a run of the baseline arm (default: the first run)")
    ap.add_argument("--out", required=True, type=Path, help="directory for the PNG, markdown and JSON")
    ap.add_argument(
        "--group-by", help="comma-separated config keys that define an arm (default: every key but seed and out_dir)"
    )
    ap.add_argument(
        "--smooth", type=float, default=0.05, help="smoothing window as a fraction of the token budget (default 0.05)"
    )
    ap.add_argument(
        "--allow-mismatch", action="store_true", help="compare runs whose data, model or token budget differ"
    )
    ap.add_argument("--no-plots", action="store_true", help="markdown and JSON only")
    ap.add_argument("--wandb", action="store_true", help="log the comparison as a run in the arms' W&B group")
    ap.add_argument("--wandb-mode", default="auto", choices=["auto", "online", "offline"])
    ap.add_argument("--wandb-project", default=None, help="default: the baseline's train.wandb.project")
    return ap.parse_args(argv)


def run(args) -> dict:
    if not 0 <= args.smooth < 1:
        raise RunError(f"--smooth {args.smooth}: expected a fraction of the token budget in [0, 1)")
    if args.wandb:
        import_wandb("--wandb")  # before anything is read or written

    def identity(source: str) -> str:  # runs/a and runs/a/ name the same run
        return source if source.startswith(WANDB_PREFIX) else str(Path(source).resolve())

    sources = []
    for source in args.runs:
        if identity(source) not in map(identity, sources):
            sources.append(source)
    if args.baseline and identity(args.baseline) not in map(identity, sources):
        sources.insert(0, args.baseline)
    runs = [load_run(s) for s in sources]
    for r in runs:  # said, not silently cut: the curves hold every intact record around a damaged line
        if r.skipped_count:
            print(
                f"warning: {r.skipped_count} damaged metrics line(s) skipped: {', '.join(r.skipped[:5])}"
                f"{' ...' if r.skipped_count > 5 else ''}",
                file=sys.stderr,
            )
    if not args.allow_mismatch:
        check_comparable(runs)
    group_by = [k.strip() for k in args.group_by.split(",") if k.strip()] if args.group_by else None
    arms = group_runs(runs, group_by)
    base_source = identity(args.baseline or sources[0])
    baseline = next(a for a in arms if any(identity(r.source) == base_source for r in a.runs))
    arms = [baseline] + [a for a in arms if a is not baseline]
    result = analysis.compare(arms, baseline, markers(baseline.runs[0].config), args.smooth)
    written = report.write(result, args.out, figures=not args.no_plots)
    summary = {
        "out": str(args.out),
        "files": written,
        "baseline": baseline.label,
        "arms": [a.label for a in arms],
        "gaps_pct": {
            f"{g['arm']}@{g['milestone']}": None if g["gap_pct"] is None else round(g["gap_pct"], 4)
            for g in result["gaps"]
        },
    }
    if args.wandb:
        config = baseline.runs[0].config
        wandb_cfg = config.get("train", {}).get("wandb", {}) or {}
        group = wandb_cfg.get("group") or config.get("experiment") or "default"
        summary["wandb_dir"] = report.log_wandb(
            result,
            group,
            args.out,
            args.wandb_mode,
            args.wandb_project or wandb_cfg.get("project") or "nvfp4train",
            wandb_cfg.get("entity"),
        )
    return summary


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    made_out = not args.out.exists()
    try:
        summary = run(args)
    except (RunError, OSError) as e:
        if isinstance(e, OSError):  # --out is a file, read-only, on a full disk
            e = f"--out {args.out}: cannot write there ({e.strerror or e}: {e.filename or args.out})"
        if made_out and args.out.is_dir():  # nothing left behind of a comparison that failed
            shutil.rmtree(args.out, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(Path(args.out, "compare.md").read_text())
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
