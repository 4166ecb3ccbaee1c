"""Writing a comparison: PNG figures (matplotlib), markdown, JSON, and a W&B run beside the arms.

Everything here reads the result of `analysis.compare`; the markdown shows no number the JSON lacks.
"""

from __future__ import annotations

import json
import math
import os
import sys
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
MATPLOTLIB_MISSING = (
    "no figures: drawing them needs matplotlib: pip install 'nvfp4train[plots]' "
    "(compare.md and compare.json are written; --no-plots skips figures)"
)


def can_draw() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def _tokens_label(value: float, _pos=None) -> str:
    """Tokens as a reader says them: 0, 500k, 2.5M, 1.2B (no `1e7` offset under the axis)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _tokens_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(_tokens_label))
    ax.set_xlabel("tokens")


def _log_axis(ax, values, axis: str = "y") -> bool:
    """A log axis whose ticks are plain numbers (2, 3, 5, 0.5), several of them even over less than a
    decade; a linear one when the values span less than a factor of 3 (a log axis would show one tick)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not finite or max(finite) / min(finite) < 3:
        return False
    lo, hi = min(finite), max(finite)
    getattr(ax, f"set_{axis}scale")("log")
    ticks = []
    for exp in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 1.5, 2, 3, 4, 5, 6, 8) if hi / lo < 20 else (1, 2, 5):
            ticks.append(m * 10.0**exp)
    shown = [t for t in ticks if lo / 1.1 <= t <= hi * 1.1]
    target = getattr(ax, f"{axis}axis")
    target.set_major_locator(FixedLocator(shown))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())
    return True


def _mark(ax, markers, with_labels: bool) -> None:
    """Data-phase switches, the LR-decay start and precision switches as vertical lines; their names on
    a second x axis above the plot (inside it they were clipped or hid the curves)."""
    styles = {"phase": ("tab:gray", ":"), "decay": ("tab:red", "--"), "switch": ("tab:purple", "-.")}
    shown = [m for m in markers if m["kind"] in styles]
    for m in shown:
        color, ls = styles[m["kind"]]
        ax.axvline(m["tokens"], color=color, ls=ls, lw=1)
    if with_labels and shown:
        top = ax.secondary_xaxis("top")
        top.set_xticks([m["tokens"] for m in shown])
        top.set_xticklabels([m["label"] for m in shown], fontsize=7, rotation=20, ha="left")
        for label, m in zip(top.get_xticklabels(), shown):
            label.set_color(styles[m["kind"]][0])


def _nan(values):
    return [math.nan if v is None else v for v in values]


# An arm's colour follows its name, so the same precision looks the same in every comparison folder.
PRECISION_COLORS = {
    "bf16": "C0",
    "fp8_blockwise": "C1",
    "mxfp4": "C2",
    "nvfp4": "C3",
    "fp8_tensorwise": "C4",
}


def arm_colors(labels: list[str]) -> dict[str, str]:
    """label -> matplotlib colour: the precision's own colour when the label names one (its last path part,
    e.g. runs/exp/nvfp4), else one drawn from the label's CRC (the same in every process and folder), moved
    on to the next free colour when two arms of one figure would share it."""
    import zlib

    colors: dict[str, str] = {}
    wanted = {label: PRECISION_COLORS.get(label.rstrip("/").rsplit("/", 1)[-1]) for label in labels}
    for label in sorted(labels, key=lambda lb: (wanted[lb] is None, lb)):  # named precisions first, then by name
        index = int(wanted[label][1:]) if wanted[label] else zlib.crc32(label.encode()) % 10
        taken = set(colors.values())
        while f"C{index % 10}" in taken and len(taken) < 10:
            index += 1
        colors[label] = f"C{index % 10}"
    return colors


def _heldout_label(arm: dict) -> str:
    n = arm.get("eval_sequences")
    return (
        f"held-out: in training, training precision, {n} sequences per source"
        if n
        else "held-out: in training, training precision"
    )


def stability_figure(result: dict, colors: dict[str, str]):
    """stability.png's figure: each arm's gradient norm (left) and throughput (right) against tokens, one line per
    run, the arm's name on its first line in each panel (so the legend has every arm, whichever of its seeds logged
    the quantity first), the markers' vertical lines named above each panel."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.3))
    grad_values = []
    for label, c in result["curves"].items():
        for ax, key in ((ax1, "grad_norm"), (ax2, "tokens_per_s")):
            lines = [points for points in c[key].values() if points]
            for i, points in enumerate(lines):
                ax.plot(*zip(*points), color=colors[label], lw=1, label=label if i == 0 else None)
            if key == "grad_norm":
                grad_values += [y for points in lines for _, y in points]
    _log_axis(ax1, grad_values)
    ax2.yaxis.set_major_formatter(FuncFormatter(_tokens_label))
    ax1.set(ylabel="gradient norm (before clipping)", title="Gradient norm")
    ax2.set(ylabel="tokens/s", title="Throughput")
    for ax in (ax1, ax2):
        _mark(ax, result["markers"], with_labels=True)
        _tokens_axis(ax)
        if ax.get_legend_handles_labels()[0]:  # a panel no run logged has no legend (matplotlib would warn)
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_figures(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colors = arm_colors([a["label"] for a in result["arms"]])
    arms = {a["label"]: a for a in result["arms"]}
    curves = result["curves"]
    any_events = any(events for c in curves.values() for events in c["events"].values())
    end = max((t for c in curves.values() for t in c["train_tokens"]), default=0.0)

    # Loss: the whole run on a log axis (left), and its second half on a linear one (right), where arms
    # that differ by a percent are told apart; held-out losses as points, offset a little per arm.
    fig, (ax_all, ax_late) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 1]})
    late_values, heldout_labels = [], set()
    for i, (label, c) in enumerate(curves.items()):
        t = c["train_tokens"]
        for ax in (ax_all, ax_late):
            ax.plot(t, _nan(c["train_loss_mean"]), color=colors[label], label=label)
            ax.fill_between(t, _nan(c["train_loss_min"]), _nan(c["train_loss_max"]), color=colors[label], alpha=0.2)
        late_values += [v for x, v in zip(t, c["train_loss_max"]) if x >= end / 2 and v is not None]
        late_values += [v for x, v in zip(t, c["train_loss_min"]) if x >= end / 2 and v is not None]
        for points in c["heldout_points"].values():
            if points:
                xs = [x + (i - (len(curves) - 1) / 2) * 0.006 * end for x, _ in points]
                ys = [y for _, y in points]
                late_values += [y for x, y in points if x >= end / 2]
                for ax in (ax_all, ax_late):
                    ax.scatter(xs, ys, color=colors[label], marker="o", edgecolor="black", s=28, zorder=3)
                heldout_labels.add(_heldout_label(arms[label]))
        for events in c["events"].values():  # loss spikes and skipped (non-finite) steps
            finite = [(x, loss) for x, loss, _ in events if loss is not None and math.isfinite(loss)]
            if finite:
                for ax in (ax_all, ax_late):
                    ax.scatter(*zip(*finite), color=colors[label], marker="x", s=40, zorder=4)
    log = _log_axis(ax_all, [v for c in curves.values() for v in c["train_loss_max"] + c["train_loss_min"]])
    finite_late = [v for v in late_values if v is not None and math.isfinite(v)]
    if end > 0 and finite_late:
        lo, hi = min(finite_late), max(finite_late)
        pad = max((hi - lo) * 0.08, 1e-3)
        ax_late.set_xlim(end / 2 - 0.02 * end, end * 1.03)
        ax_late.set_ylim(lo - pad, hi + pad)
    for ax in (ax_all, ax_late):
        _mark(ax, result["markers"], with_labels=True)
        _tokens_axis(ax)
        ax.set_ylabel("loss")
    ax_all.set_title("The whole run" + (" (log scale)" if log else ""), fontsize=10)
    ax_late.set_title("The second half", fontsize=10)
    title = "Loss against tokens" + ("; x: a loss spike or a skipped step" if any_events else "")
    fig.suptitle(title)
    from matplotlib.lines import Line2D

    handles, _ = ax_all.get_legend_handles_labels()
    handles = handles + [
        Line2D([], [], ls="", marker="o", color="white", markeredgecolor="black", label=text)
        for text in sorted(heldout_labels)
    ]
    handles.append(
        Line2D([], [], color="gray", alpha=0.4, lw=6, label="training loss, smoothed; band: min-max over seeds")
    )
    ax_all.legend(handles=handles, fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=120)
    written.append("loss.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.axhline(0, color="black", lw=0.8)
    for label, c in curves.items():
        if label == result["baseline"]:
            continue
        t = c["relative_tokens"]
        ax.plot(t, _nan(c["relative_pct_mean"]), color=colors[label], label=label)
        ax.fill_between(t, _nan(c["relative_pct_min"]), _nan(c["relative_pct_max"]), color=colors[label], alpha=0.2)
    _mark(ax, result["markers"], with_labels=True)
    _tokens_axis(ax)
    ax.set(
        ylabel=f"relative difference to {result['baseline']} (%)",
        title="(arm - baseline) / baseline: training loss, smoothed (band: min-max over seeds)",
    )
    if len(curves) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "relative_loss.png", dpi=120)
    written.append("relative_loss.png")
    plt.close(fig)

    fig = stability_figure(result, colors)
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
    lines += _table(
        ["arm", "seeds", "runs"], [[a["label"], str(a["seeds"]), ", ".join(a["runs"])] for a in result["arms"]]
    )
    lines += [
        "",
        f"Training loss smoothed with a trailing mean over {result['smoothing_window_tokens']:,.0f} tokens; "
        "gap = (arm − baseline) / baseline in % of the smoothed mean over seeds; spread = (max − min) / mean "
        "of the baseline's seeds.",
        "",
    ]
    lines += ["## Gaps at milestones", ""]
    rows = [
        [
            g["arm"],
            g["milestone"],
            f"{g['tokens']:,.0f}",
            _f(g["arm_loss"]),
            _f(g["baseline_loss"]),
            _f(g["gap_pct"], "+.3f"),
            _f(g["baseline_spread_pct"], ".3f", "n/a (1 seed)"),
            {True: "yes", False: "no", None: "—"}[g["exceeds_baseline_spread"]],
        ]
        for g in result["gaps"]
    ]
    lines += _table(
        ["arm", "milestone", "tokens", "arm loss", "baseline loss", "gap %", "baseline spread %", "gap > spread"], rows
    )
    held = {k: v for k, v in result["heldout"].items() if v}
    if held:
        sources = sorted(set().union(*(v["loss"] for v in held.values())))
        counts = sorted({str(a.get("eval_sequences")) for a in result["arms"] if a.get("eval_sequences")})
        what = f", {' / '.join(counts)} sequences per source" if counts else ""
        lines += [
            "",
            f"## Held-out loss (in training, training precision{what}; the last evaluation all seeds share)",
            "",
        ]
        rows = []
        for label, v in held.items():
            rel = v.get("relative_pct", {})
            rows.append(
                [label, f"{v['tokens']:,}"]
                + [_f(v["loss"].get(s)) + (f" ({rel[s]:+.2f}%)" if s in rel else "") for s in sources]
            )
        lines += _table(["arm", "tokens"] + sources, rows)
    lines += ["", "## Stability and cost", ""]
    rows = []
    for label, runs in result["stability"].items():
        for s in runs:
            rows.append(
                [
                    label,
                    s["run"],
                    str(s["last_step"]),
                    _f(s["final_loss"]),
                    str(s["skipped_steps"]),
                    str(s["loss_spikes"]),
                    _f(s["grad_norm_median"], ".3f"),
                    _f(s["grad_norm_max"], ".3f"),
                    _f(s["tokens_per_s"], ",.0f"),
                    _f(s["peak_mem_gib"], ".2f", "not recorded"),
                    _f(s["checkpoint_time_s"], ".2f", "not recorded"),
                ]
            )
    lines += _table(
        [
            "arm",
            "run",
            "last step",
            "final loss",
            "skipped steps",
            "loss spikes",
            "grad norm median",
            "grad norm max",
            "tokens/s",
            "peak memory GiB",
            "checkpoint s",
        ],
        rows,
    )
    if result["eval"]:
        labels = [a["label"] for a in result["arms"]]
        lines += ["", "## Downstream evaluation (eval.json, BF16; mean over seeds)", ""]
        rows = [[name] + [_f(v.get(label, {}).get("mean")) for label in labels] for name, v in result["eval"].items()]
        lines += _table(["task (metric)"] + labels, rows)
    lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    return "\n".join(lines)


def write(result: dict, out: Path, figures: bool = True) -> list[str]:
    """compare.json, compare.md and (with matplotlib installed) the figures. Without matplotlib the
    figures are left out with one line on stderr, so a plain install still compares."""
    out.mkdir(parents=True, exist_ok=True)
    result = clean(result)
    if figures and not can_draw():
        print(MATPLOTLIB_MISSING, file=sys.stderr)
        figures = False
    written = write_figures(result, out) if figures else []
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "compare.md").write_text(markdown(result, written))
    return written + ["compare.json", "compare.md"]


# ------------------------------------------------------------------------------------- W&B
def log_wandb(
    result: dict, group: str, out: Path, mode: str = "auto", project: str = "nvfp4train", entity: str | None = None
) -> str:
    """One W&B run in the arms' group: relative-loss and loss curves against tokens, the gap table.
    Returns the run's local directory (an `offline-run-*` directory in offline mode)."""
    import wandb

    result = clean(result)
    if mode == "auto":  # as the trainer does: online with a key, offline without one
        has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
        mode = "online" if has_key else "offline"
    arms = [a["label"] for a in result["arms"]]
    run = wandb.init(
        project=project,
        entity=entity,
        group=group,
        job_type="compare",
        name=f"compare: {' vs '.join(arms)}",
        dir=str(out),
        mode=mode,
        config={
            "baseline": result["baseline"],
            "arms": result["arms"],
            "smoothing_window_tokens": result["smoothing_window_tokens"],
        },
    )
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
    columns = [
        "arm",
        "milestone",
        "tokens",
        "arm_loss",
        "baseline_loss",
        "gap_pct",
        "baseline_spread_pct",
        "exceeds_baseline_spread",
    ]
    run.log({"gaps": wandb.Table(columns=columns, data=[[g[c] for c in columns] for g in result["gaps"]])})
    for g in result["gaps"]:
        run.summary[f"gap_pct/{g['arm']}/{g['milestone']}"] = g["gap_pct"]
    directory = run.dir.rsplit("/files", 1)[0] if run.dir else str(out)
    run.finish()
    return directory
