"""docs/results/reproduction.md from the ingested runs: our numbers beside the paper's.

Each experiment is compared with `nvfp4train.compare` (its own arms plus the arms it borrows from another
experiment, against its baseline arm): the comparison's figures, compare.md and compare.json go to
docs/results/<experiment>/. reproduction.md then puts the paper's claims (arXiv 2509.25149) beside the
same quantities measured here, each gap with the seed-to-seed spread; a claim whose runs are missing says
"not run".
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from nvfp4train.compare import analysis, report as compare_report
from nvfp4train.compare.runs import Arm, check_comparable, load_run, markers
from nvfp4train.eval.weights import RunError
from nvfp4train.reproduce.runner import (Experiment, UsageError, data_epochs, experiment_names, load_experiment,
                                         model_params)

NOT_RUN = "not run"
SMOOTH = 0.05   # the comparison's default window: 5% of the token budget

# The paper's claims, row by row: (experiment, arm, measure, baseline arm or None for the experiment's own,
# what the paper reports). measure: "stable" = smoothed training loss at the end of the stable phase (the
# LR-decay start), "end" = at the end of the run, "heldout" = held-out loss at the end, "final" = each
# arm's own final training loss (arms of different token budgets).
CLAIMS = {
    "fp8_vs_nvfp4": [
        ("nvfp4", "stable_max", None, "< 1% (12B, validation loss, whole stable phase)"),
        ("nvfp4", "stable", None, "< 1% (12B, validation loss, whole stable phase)"),
        ("nvfp4", "end", None, "≈ 1.5% (12B, end of the decay)"),
        ("nvfp4", "heldout", None, "≈ 1.5% (12B, validation loss)"),
        ("bf16", "end", None, "— (not reported; FP8 is the reference)"),
    ],
    "nvfp4_ablations": [
        ("no_sr", "end", None, "worse (12B Fig. 4; at 1.2B RNE gradients diverge)"),
        ("no_rht", "end", None, "worse (12B Fig. 4; 1.2B Fig. 11)"),
        ("no_2d", "end", None, "worse (12B Fig. 4; 1.2B Fig. 14)"),
        ("all_layers", "end", None, "diverges (1.2B, App. E.2); last blocks in BF16 needed"),
        ("rht_everywhere", "end", None, "worse (1.2B, RHT on Fprop/Dgrad, Fig. 11)"),
        ("fp8_blockwise", "end", None, "better than NVFP4 (the FP8 baseline, for reference)"),
    ],
    "mxfp4": [
        ("nvfp4", "end", None, "≈ 1.5% (8B, 1T tokens, training loss)"),
        ("mxfp4", "end", None, "≈ 2.5% (8B, 1T tokens, training loss)"),
        ("mxfp4_1.36x", "final", "nvfp4", "≈ 0% (MXFP4 needs 1.36x the tokens to match NVFP4)"),
    ],
    "bf16_switch": [
        ("nvfp4", "end", None, "≈ 1.5% (12B, no switch)"),
        ("switch_forward", "end", None, "≈ 0.5% (12B, forward-only switch at 8.2T of 10T)"),
        ("switch_full", "end", None, "≈ 0% (12B, full switch at 8.2T)"),
        ("nvfp4", "heldout", None, "≈ 1.5% (12B, validation loss, no switch)"),
        ("switch_forward", "heldout", None, "≈ 0.5% (12B, validation loss)"),
        ("switch_full", "heldout", None, "≈ 0% (12B, validation loss)"),
    ],
}
MEASURE_TEXT = {"stable_max": "training loss, largest gap in the stable phase (after its first 10% of tokens)",
                "stable": "training loss, end of the stable phase", "end": "training loss, end of run",
                "heldout": "held-out loss, end of run", "final": "final training loss, each at its own end"}
# The paper's Table 2 (12B, 10T tokens; evaluated in BF16): category means, FP8 / NVFP4.
PAPER_TABLE2 = [("General", 68.99, 69.82), ("Math", 86.20, 86.88), ("Multilingual", 77.93, 80.24),
                ("Code", 59.52, 56.67), ("Commonsense understanding", 77.29, 76.75)]


def arm_runs(runs_root: Path, experiment: str, arm: str) -> list:
    """The arm's finished runs (their seeds) under runs_root/<experiment>/<arm>/seed*/."""
    return [load_run(str(d)) for d in sorted((runs_root / experiment / arm).glob("seed*"))
            if (d / "metrics.jsonl").is_file() and (d / "config.yaml").is_file()]


def final_heldout(run) -> float | None:
    values = [r["val/mean"] for r in run.records if r.get("val/mean") is not None]
    return float(values[-1]) if values else None


def spread(values: list[float]) -> float | None:
    """(max - min) / mean in %; None with fewer than 2 values."""
    return (max(values) - min(values)) / (sum(values) / len(values)) * 100 if len(values) > 1 else None


def compare_experiment(exp: Experiment, runs_root: Path, out: Path, figures: bool) -> dict:
    """Every number reproduction.md shows for one experiment (and the comparison's files under out/)."""
    arms = []
    for name in [exp.baseline] + [a for a in list(exp.borrow) + list(exp.arms) if a != exp.baseline]:
        runs = arm_runs(runs_root, exp.borrow.get(name, exp.name), name)
        if runs:
            arms.append(Arm(name, runs, {}))
    summary = {"experiment": exp, "arms": {a.label: a for a in arms}, "result": None, "note": None}
    if not arms or arms[0].label != exp.baseline:
        summary["note"] = f"the baseline arm ({exp.baseline}) has no runs yet"
        return summary
    same_budget = [r for a in arms if exp.arms.get(a.label) is None or exp.arms[a.label].tokens_factor == 1.0
                   for r in a.runs]
    try:
        check_comparable(same_budget)
    except RunError as e:
        summary["note"] = f"not comparable: {e}"
        return summary
    result = analysis.compare(arms, arms[0], markers(arms[0].runs[0].config), SMOOTH)
    compare_report.write(result, out / exp.name, figures=figures)
    summary["result"] = compare_report.clean(result)
    return summary


def end_values(summary: dict, arm: str, measure: str) -> list[float]:
    """Per-seed values of an arm: final held-out loss, or its smoothed training loss at its own end."""
    a = summary["arms"].get(arm)
    if a is None:
        return []
    if measure == "heldout":
        return [v for v in map(final_heldout, a.runs) if v is not None]
    values = []
    for run in a.runs:
        tokens, loss = analysis.train_curve(run)
        if len(tokens):
            window = max(SMOOTH * float(tokens[-1]), 1.0)
            values.append(float(analysis.smooth(tokens, loss, window)[-1]))
    return values


def gap_cell(summary: dict, arm: str, measure: str, baseline: str | None) -> str:
    exp, result = summary["experiment"], summary["result"]
    baseline = baseline or exp.baseline
    if result is None or arm not in summary["arms"] or baseline not in summary["arms"]:
        return NOT_RUN
    n_arm, n_base = len(summary["arms"][arm].runs), len(summary["arms"][baseline].runs)
    if measure == "stable_max":  # the largest gap of the mean curves between 10% of the tokens and the decay
        decay = next((m["tokens"] for m in result["markers"] if m["kind"] == "decay"), None)
        curve = result["curves"][arm]
        total = next(m["tokens"] for m in result["markers"] if m["kind"] == "end")
        gaps = [(g, t) for t, g in zip(curve["relative_tokens"], curve["relative_pct_mean"])
                if g is not None and 0.1 * total <= t <= (decay or total)]
        if not gaps:
            return NOT_RUN
        worst, at = max(gaps, key=lambda gt: abs(gt[0]))

        def spread_at(label):  # (max - min) / mean of an arm's smoothed seeds where the worst gap is
            c = result["curves"][label]
            i = min(range(len(c["train_tokens"])), key=lambda k: abs(c["train_tokens"][k] - at))
            lo, hi, mean = c["train_loss_min"][i], c["train_loss_max"][i], c["train_loss_mean"][i]
            return (hi - lo) / mean * 100 if len(summary["arms"][label].runs) > 1 and mean else None
        return _gap_text(worst, spread_at(baseline), spread_at(arm), n_arm, n_base) + f" at {at:,.0f} tokens"
    if measure in ("stable", "end") and baseline == exp.baseline:
        label = "LR decay" if measure == "stable" else "end of run"
        gap = next((g for g in result["gaps"] if g["arm"] == arm and g["milestone"] == label), None)
        if gap is None or gap["gap_pct"] is None:
            return NOT_RUN
        return _gap_text(gap["gap_pct"], gap["baseline_spread_pct"], gap["arm_spread_pct"], n_arm, n_base)
    a, b = end_values(summary, arm, measure), end_values(summary, baseline, measure)
    if not a or not b:
        return NOT_RUN
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    return _gap_text((mean_a - mean_b) / mean_b * 100, spread(b), spread(a), len(a), len(b))


def _gap_text(gap: float, base_spread: float | None, arm_spread: float | None, n_arm: int, n_base: int) -> str:
    def pct(v):
        return "n/a" if v is None else f"{v:.2f}%"
    return f"{gap:+.2f}% (seed spread: baseline {pct(base_spread)}, arm {pct(arm_spread)}; seeds {n_arm} vs {n_base})"


def short_commit(commit: str) -> str:
    """10 hex digits, keeping the `-dirty` mark of a checkout with uncommitted changes."""
    dirty = commit.endswith("-dirty")
    return commit.removesuffix("-dirty")[:10] + ("-dirty" if dirty else "")


def setup_lines(summaries: list[dict]) -> list[str]:
    """Model, tokens, data passes and hardware, from the runs' own config.yaml and run.json."""
    runs = [r for s in summaries for a in s["arms"].values() for r in a.runs]
    if not runs:
        return ["No runs ingested yet: every cell below says \"not run\"."]
    cfg = runs[0].config
    t, o = cfg["train"], cfg["optim"]
    params, non_embedding = model_params(cfg["model"])
    tokens = int(t["max_steps"]) * int(t["global_batch_size"]) * int(t["seq_len"])
    try:
        epochs = data_epochs(cfg, tokens)
        passes = (f"Each run passes {min(epochs.values()):.1f} to {max(epochs.values()):.1f} times over a "
                  "source's training tokens (by the phase weights).")
    except UsageError:
        passes = "(Passes over the data: the token shards are not on this machine.)"
    infos = []
    for run in runs:
        path = Path(run.source) / "run.json"
        if path.is_file():
            infos.append(json.loads(path.read_text()))
    gpus = sorted({i.get("gpu", "?") for i in infos}) or ["not recorded"]
    torches = sorted({i.get("torch", "?") for i in infos}) or ["not recorded"]
    commits = sorted({short_commit(i.get("commit", "?")) for i in infos}) or ["not recorded"]
    sharing = sorted({int(i.get("runs_per_gpu", 1)) for i in infos}) or [1]
    lines = [
        f"- Model `{cfg['model']['name']}` (pattern `{cfg['model']['pattern']}`, d_model {cfg['model']['d_model']}): "
        f"{params / 1e6:.1f}M parameters, {non_embedding / 1e6:.1f}M without the embedding and LM head.",
        f"- {tokens:,} training tokens per run ({t['max_steps']} steps × {t['global_batch_size']} × {t['seq_len']}): "
        f"{tokens / non_embedding:.1f} tokens per non-embedding parameter ({tokens / params:.1f} counting "
        "embeddings); the paper trains at ~800 (12B, 10T tokens). " + passes,
        f"- WSD schedule: peak LR {o['lr']}, {o['schedule']['warmup_steps']} warmup steps, decay over the last "
        f"{o['schedule']['decay_fraction']:.0%} to {o['min_lr']}; data phases at "
        + " / ".join(f"{p['start']:.0%}" for p in cfg["data"]["phases"]) + " of the tokens; "
        f"AdamW betas {o['betas']}, weight decay {o['weight_decay']}, gradient clip {o['grad_clip']}.",
        f"- Hardware: {', '.join(gpus)}; torch {', '.join(torches)}; "
        f"{', '.join(map(str, sharing))} run(s) per device at a time; "
        f"commit(s) {', '.join(commits)}. NVFP4 and MXFP4 are emulated (Hopper has no FP4 tensor cores), "
        "bit-exact with Transformer Engine's reference quantizer.",
    ]
    return lines


def write_report(runs_root: Path, out: Path, experiments_dir: Path, figures: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    names = experiment_names(experiments_dir)
    names = [n for n in CLAIMS if n in names] + [n for n in names if n not in CLAIMS]  # the paper's order first
    summaries = [compare_experiment(load_experiment(n, experiments_dir), runs_root, out, figures) for n in names]
    rel = os.path.relpath
    lines = ["# Reproduction: Pretraining LLMs with NVFP4 (arXiv 2509.25149), scaled down", "",
             "Generated by `python -m nvfp4train.reproduce report` from the runs in "
             f"`{rel(runs_root, out)}/` (ingested with `python -m nvfp4train.reproduce ingest`); the experiments are "
             "`configs/reproduce/*.yaml`. Gap = (arm − baseline) / baseline of the loss, mean over seeds, in %; "
             "positive = the arm is worse. Seed spread = (max − min) / mean over an arm's seeds. "
             f"Training losses are smoothed over the last {SMOOTH:.0%} of the tokens.", "", "## Setup", ""]
    lines += setup_lines(summaries)
    for s in summaries:
        exp = s["experiment"]
        lines += ["", f"## {exp.name}: {exp.description}", ""]
        present = ", ".join(f"{name} ({len(a.runs)} seed{'s' if len(a.runs) > 1 else ''})"
                            for name, a in s["arms"].items()) or "none"
        lines += [f"Baseline: `{exp.baseline}`. Arms with runs: {present}."
                  + (f" Borrowed from other experiments: {', '.join(f'{a} ({e})' for a, e in exp.borrow.items())}."
                     if exp.borrow else "")]
        if s["note"]:
            lines += ["", f"Not compared: {s['note']}."]
        rows = []
        claims = CLAIMS.get(exp.name) or [(a, "end", None, "—") for a in exp.arms if a != exp.baseline]
        for arm, measure, baseline, paper in claims:
            rows.append([f"{arm} vs {baseline or exp.baseline}", MEASURE_TEXT[measure], paper,
                         gap_cell(s, arm, measure, baseline)])
        lines += [""] + compare_report._table(["arms", "measure", "paper", "here"], rows)
        if s["result"] is not None:
            speeds = []
            for name, stats in s["result"]["stability"].items():
                values = [x["tokens_per_s"] for x in stats if x["tokens_per_s"]]
                if values:
                    speeds.append(f"{name} {sum(values) / len(values):,.0f}")
            lines += ["", f"Median tokens/s per run: {'; '.join(speeds)}." if speeds else "",
                      f"Curves, stability and every milestone: [{exp.name}/compare.md]({exp.name}/compare.md)"
                      + ("".join(f", [{f}]({exp.name}/{f})" for f in ("loss.png", "relative_loss.png", "stability.png"))
                         if figures else "") + "."]
            if figures:
                lines += ["", f"![relative loss]({exp.name}/relative_loss.png)"]
    lines += ["", "## Downstream (BF16 evaluation of the final checkpoints)", ""]
    main = next((s for s in summaries if s["experiment"].name == "fp8_vs_nvfp4"), None)
    table = (main or {}).get("result") and main["result"]["eval"]
    if table:
        labels = list(main["arms"])
        rows = [[name] + [f"{v[a]['mean']:.4f}" if a in v else NOT_RUN for a in labels] for name, v in table.items()]
        lines += compare_report._table(["task (metric)"] + labels, rows)
    else:
        lines += [f"{NOT_RUN} (no eval.json in the fp8_vs_nvfp4 runs)."]
    lines += ["", "The paper's Table 2 (12B, 10T tokens), category means FP8 / NVFP4: "
              + "; ".join(f"{name} {fp8:.2f} / {nv:.2f}" for name, fp8, nv in PAPER_TABLE2)
              + ". Our tasks are the offline ones of `evals/` (a 31M-parameter model scores near chance on "
              "most; held-out losses are the sharper measure).", ""]
    path = out / "reproduction.md"
    path.write_text("\n".join(lines))
    return path
