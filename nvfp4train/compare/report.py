"""Writing a comparison: PNG figures (matplotlib), markdown, JSON, and a W&B run beside the arms.

Everything here reads the result of `analysis.compare`; the markdown shows no number the JSON lacks.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path


def clean(value):
    """NaN/inf -> None (JSON has no NaN), numpy scalars -> Python numbers, recursively."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ------------------------------------------------------------------------------------- figures
def _mark(ax, markers, with_labels: bool) -> None:
    styles = {"phase": ("tab:gray", ":"), "decay": ("tab:red", "--"), "switch": ("tab:purple", "-.")}
    for m in markers:
        if m["kind"] in styles:
            color, ls = styles[m["kind"]]
            ax.axvline(m["tokens"], color=color, ls=ls, lw=1)
            if with_labels:
                ax.text(m["tokens"], 1.0, " " + m["label"], transform=ax.get_xaxis_transform(), rotation=90,
                        va="top", ha="right", fontsize=7, color=color)


def _nan(values):
    return [math.nan if v is None else v for v in values]


def write_figures(result: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colors = {a["label"]: f"C{i}" for i, a in enumerate(result["arms"])}

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, c in result["curves"].items():
        t = c["train_tokens"]
        ax.plot(t, _nan(c["train_loss_mean"]), color=colors[label], label=f"{label} (train, smoothed)")
        ax.fill_between(t, _nan(c["train_loss_min"]), _nan(c["train_loss_max"]), color=colors[label], alpha=0.2)
        for i, points in enumerate(c["heldout_points"].values()):
            if points:
                ax.scatter(*zip(*points), color=colors[label], marker="o", edgecolor="black", zorder=3,
                           label=f"{label} (held-out)" if i == 0 else None)
        for events in c["events"].values():  # loss spikes and skipped (non-finite) steps
            finite = [(t, loss) for t, loss, _ in events if loss is not None and math.isfinite(loss)]
            if finite:
                ax.scatter(*zip(*finite), color=colors[label], marker="x", s=40, zorder=4)
    _mark(ax, result["markers"], with_labels=True)
    ax.set(xlabel="tokens", ylabel="loss", title="Loss against tokens (x: loss spike or skipped step)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=120)
    written.append("loss.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.axhline(0, color="black", lw=0.8)
    for label, c in result["curves"].items():
        if label == result["baseline"]:
            continue
        t = c["relative_tokens"]
        ax.plot(t, _nan(c["relative_pct_mean"]), color=colors[label], label=label)
        ax.fill_between(t, _nan(c["relative_pct_min"]), _nan(c["relative_pct_max"]), color=colors[label], alpha=0.2)
    _mark(ax, result["markers"], with_labels=True)
    ax.set(xlabel="tokens", ylabel=f"relative difference to {result['baseline']} (%)",
           title="(arm - baseline) / baseline, training loss, smoothed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "relative_loss.png", dpi=120)
    written.append("relative_loss.png")
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, c in result["curves"].items():
        for i, points in enumerate(c["grad_norm"].values()):
            if points:
                ax1.plot(*zip(*points), color=colors[label], lw=1, label=label if i == 0 else None)
        for i, points in enumerate(c["tokens_per_s"].values()):
            if points:
                ax2.plot(*zip(*points), color=colors[label], lw=1, label=label if i == 0 else None)
    _mark(ax1, result["markers"], with_labels=False)
    ax1.set(xlabel="tokens", ylabel="gradient norm (before clipping)", title="Gradient norm", yscale="log")
    ax2.set(xlabel="tokens", ylabel="tokens/s", title="Throughput")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "stability.png", dpi=120)
    written.append("stability.png")
    plt.close(fig)
    return written


# ------------------------------------------------------------------------------------ markdown
def _f(value, fmt: str = ".4f", missing: str = "—") -> str:
    return missing if value is None else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(result: dict, figures: list[str]) -> str:
    lines = [f"# Comparison against {result['baseline']}", ""]
    lines += _table(["arm", "seeds", "runs"], [[a["label"], str(a["seeds"]), ", ".join(a["runs"])]
                                               for a in result["arms"]])
    lines += ["", f"Training loss smoothed with a trailing mean over {result['smoothing_window_tokens']:,.0f} tokens; "
              "gap = (arm − baseline) / baseline in % of the smoothed mean over seeds; spread = (max − min) / mean "
              "of the baseline's seeds.", ""]
    lines += ["## Gaps at milestones", ""]
    rows = [[g["arm"], g["milestone"], f"{g['tokens']:,.0f}", _f(g["arm_loss"]), _f(g["baseline_loss"]),
             _f(g["gap_pct"], "+.3f"), _f(g["baseline_spread_pct"], ".3f", "n/a (1 seed)"),
             {True: "yes", False: "no", None: "—"}[g["exceeds_baseline_spread"]]] for g in result["gaps"]]
    lines += _table(["arm", "milestone", "tokens", "arm loss", "baseline loss", "gap %", "baseline spread %",
                     "gap > spread"], rows)
    held = {k: v for k, v in result["heldout"].items() if v}
    if held:
        sources = sorted(set().union(*(v["loss"] for v in held.values())))
        lines += ["", "## Held-out loss (last evaluation all seeds share)", ""]
        rows = []
        for label, v in held.items():
            rel = v.get("relative_pct", {})
            rows.append([label, f"{v['tokens']:,}"] + [
                _f(v["loss"].get(s)) + (f" ({rel[s]:+.2f}%)" if s in rel else "") for s in sources])
        lines += _table(["arm", "tokens"] + sources, rows)
    lines += ["", "## Stability and cost", ""]
    rows = []
    for label, runs in result["stability"].items():
        for s in runs:
            rows.append([label, s["run"], str(s["last_step"]), _f(s["final_loss"]), str(s["skipped_steps"]),
                         str(s["loss_spikes"]), _f(s["grad_norm_median"], ".3f"), _f(s["grad_norm_max"], ".3f"),
                         _f(s["tokens_per_s"], ",.0f"), _f(s["peak_mem_gib"], ".2f", "not recorded"),
                         _f(s["checkpoint_time_s"], ".2f", "not recorded")])
    lines += _table(["arm", "run", "last step", "final loss", "skipped steps", "loss spikes", "grad norm median",
                     "grad norm max", "tokens/s", "peak memory GiB", "checkpoint s"], rows)
    if result["eval"]:
        labels = [a["label"] for a in result["arms"]]
        lines += ["", "## Downstream evaluation (eval.json, BF16; mean over seeds)", ""]
        rows = [[name] + [_f(v.get(label, {}).get("mean")) for label in labels] for name, v in result["eval"].items()]
        lines += _table(["task (metric)"] + labels, rows)
    lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    return "\n".join(lines)


def write(result: dict, out: Path, figures: bool = True) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    result = clean(result)
    written = write_figures(result, out) if figures else []
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "compare.md").write_text(markdown(result, written))
    return written + ["compare.json", "compare.md"]


# ------------------------------------------------------------------------------------- W&B
def log_wandb(result: dict, group: str, out: Path, mode: str = "auto", project: str = "nvfp4train",
              entity: str | None = None) -> str:
    """One W&B run in the arms' group: relative-loss and loss curves against tokens, the gap table.
    Returns the run's local directory (an `offline-run-*` directory in offline mode)."""
    import wandb

    result = clean(result)
    if mode == "auto":  # as the trainer does: online with a key, offline without one
        has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
        mode = "online" if has_key else "offline"
    arms = [a["label"] for a in result["arms"]]
    run = wandb.init(project=project, entity=entity, group=group, job_type="compare",
                     name=f"compare: {' vs '.join(arms)}", dir=str(out), mode=mode,
                     config={"baseline": result["baseline"], "arms": result["arms"],
                             "smoothing_window_tokens": result["smoothing_window_tokens"]})
    run.define_metric("tokens")
    for prefix in ("relative_loss_pct", "train_loss"):
        run.define_metric(f"{prefix}/*", step_metric="tokens")
    rows: dict[float, dict] = {}
    for label, c in result["curves"].items():
        for t, v in zip(c["train_tokens"], c["train_loss_mean"]):
            rows.setdefault(t, {})[f"train_loss/{label}"] = v
        if label != result["baseline"]:
            for t, v in zip(c["relative_tokens"], c["relative_pct_mean"]):
                rows.setdefault(t, {})[f"relative_loss_pct/{label}"] = v
    for t in sorted(rows):
        run.log({"tokens": t, **{k: v for k, v in rows[t].items() if v is not None}})
    columns = ["arm", "milestone", "tokens", "arm_loss", "baseline_loss", "gap_pct", "baseline_spread_pct",
               "exceeds_baseline_spread"]
    run.log({"gaps": wandb.Table(columns=columns, data=[[g[c] for c in columns] for g in result["gaps"]])})
    for g in result["gaps"]:
        run.summary[f"gap_pct/{g['arm']}/{g['milestone']}"] = g["gap_pct"]
    directory = run.dir.rsplit("/files", 1)[0] if run.dir else str(out)
    run.finish()
    return directory
