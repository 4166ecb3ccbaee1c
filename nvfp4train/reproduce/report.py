"""docs/results/reproduction.md (+ figures) from whatever runs are finished under the results dirs.

One row per claim of the paper (arXiv 2509.25149) and experiment: the paper's value, ours as a paired
95% interval over seeds (stats.py) with its seed count, the verdict, and flags where the paired runs
differ in GPU model, commit, token budget or evaluation. Held-out numbers say what they are: the
in-training validation (at the precision it names, N sequences per source) or the BF16 evaluation of
the final checkpoint (eval.json).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from nvfp4train.reproduce import stats
from nvfp4train.reproduce.claims import CLAIMS, METRIC_TEXT, ClaimRow
from nvfp4train.reproduce.experiments import (
    EXPERIMENTS_DIR,
    Experiment,
    all_experiments,
)
from nvfp4train.reproduce.plan import model_params
from nvfp4train.runs import finished_run

TIER_TITLES = {
    "A": "Tier A: hybrid_repro, 1.75 tokens per parameter",
    "B": "Tier B: hybrid_5m, 20 tokens per parameter",
    "earlier": "Earlier runs (≤ 1.75 tokens per parameter, one GPU shared by many runs)",
}


# ------------------------------------------------------------------------------------------- runs
@dataclass
class RunData:
    key: tuple[str, str, int]
    path: Path
    config: dict
    train: dict[float, float]
    val: dict[float, float]
    total: float
    info: dict = field(default_factory=dict)
    eval: dict | None = None
    repeats_from: float | None = None  # tokens at which the first data source began its second pass
    val_sources: dict[str, dict[float, float]] = field(default_factory=dict)  # in-training validation per source

    @property
    def val_label(self) -> str:
        t = self.config.get("train", {})
        precision = "BF16" if t.get("eval_precision") == "bf16" else "training precision"
        return f"in-training validation ({precision}, {t.get('eval_sequences', '?')} seq/source)"

    @property
    def eval_sequences(self) -> int | None:
        if not self.eval:
            return None
        seq = int(self.eval.get("max_len") or self.config["train"]["seq_len"])
        return sum(int(v.get("tokens", 0)) // seq for v in self.eval.get("heldout", {}).values())


def load_run(path: Path, experiment: str, arm: str, seed: int) -> RunData | None:
    """A finished run (`nvfp4train.runs.finished_run`: run.json says done, the metrics reach train.max_steps),
    None for one that is not; a run whose files are damaged or disagree is refused in one line (RunError)."""
    run = finished_run(path)
    if run is None:
        return None
    if run.metrics.damaged_count:  # said, not silently cut: the curves hold every intact record around it
        print(
            f"warning: {run.metrics.damaged_count} damaged metrics line(s) skipped: "
            f"{', '.join(run.metrics.damaged_names[:5])}{' ...' if run.metrics.damaged_count > 5 else ''}",
            file=sys.stderr,
        )
    config, t = run.config, run.config["train"]
    per_step = t["global_batch_size"] * t["seq_len"]
    train, val, val_sources, repeats_from = {}, {}, {}, None
    for r in run.metrics.records:
        tokens = float(r.get("tokens", r["step"] * per_step))
        if repeats_from is None and any(
            k.startswith("data/epochs/") and isinstance(v, (int, float)) and v >= 1 for k, v in r.items()
        ):
            repeats_from = tokens
        if r.get("loss") is not None:
            train[tokens] = float(r["loss"])
        if r.get("val/mean") is not None:
            val[tokens] = float(r["val/mean"])
            for k, v in r.items():
                if k.startswith("val/") and k != "val/mean" and isinstance(v, (int, float)):
                    val_sources.setdefault(k[4:], {})[tokens] = float(v)
    return RunData(
        (experiment, arm, seed),
        path,
        config,
        train,
        val,
        float(t["max_steps"] * per_step),
        run.info,
        run.eval,
        repeats_from,
        val_sources,
    )


def load_runs(results_dirs: list[Path]) -> dict[tuple[str, str, int], RunData]:
    """Every finished run under the results dirs (<experiment>/<arm>/seed<k>/); the first dir wins a tie."""
    runs = {}
    for root in results_dirs:
        for d in sorted({m.parent for m in Path(root).glob("*/*/seed*/metrics.jsonl*")}):
            experiment, arm, seed = d.parts[-3], d.parts[-2], d.name[4:]
            if not seed.isdigit() or (experiment, arm, int(seed)) in runs:
                continue
            run = load_run(d, experiment, arm, int(seed))
            if run is not None:
                runs[run.key] = run
    return runs


def arm_runs(runs: dict, exp: Experiment, arm: str) -> dict[int, RunData]:
    source = exp.arm_source(arm)
    return {k[2]: r for k, r in runs.items() if k[0] == source and k[1] == arm}


# ------------------------------------------------------------------------------------- statistics
def compare(arm: dict[int, RunData], base: dict[int, RunData], metric: str):
    """(interval, per-seed values) of one metric, paired by seed."""
    seeds = sorted(set(arm) & set(base))
    if not seeds:
        return None, {}
    total = base[seeds[0]].total
    if metric in ("train_stable", "train_decay", "val_stable", "val_decay"):
        kind, window = metric.split("_")
        window = stats.STABLE if window == "stable" else stats.DECAY
        curves = (lambda r: r.train) if kind == "train" else (lambda r: r.val)
        return stats.paired_window_gap(
            {s: curves(arm[s]) for s in seeds}, {s: curves(base[s]) for s in seeds}, total, window
        )
    if metric == "widening":
        _, stable = compare(arm, base, "val_stable")
        _, decay = compare(arm, base, "val_decay")
        per_seed = {s: decay[s] - stable[s] for s in seeds if s in stable and s in decay}
        return (stats.mean_interval(list(per_seed.values())) if per_seed else None), per_seed
    if metric == "eval_end":
        a = {s: arm[s].eval["heldout_mean_loss"] for s in seeds if arm[s].eval}
        b = {s: base[s].eval["heldout_mean_loss"] for s in seeds if base[s].eval}
        return stats.paired_end_gap(a, b)
    if metric == "token_ratio":
        per_seed = {}
        for s in seeds:
            if arm[s].val and base[s].val:
                ratio = stats.token_ratio(arm[s].val, arm[s].total, base[s].val, base[s].total)
                if ratio is not None:
                    per_seed[s] = (ratio - 1.0) * 100.0
        return (stats.mean_interval(list(per_seed.values())) if per_seed else None), per_seed
    raise ValueError(f"unknown metric {metric!r}")


def short_commit(run: RunData) -> str:
    return str(run.info.get("commit", "not recorded"))[:10]


def flags(runs: list[RunData], same_bits: list[set[str]] = ()) -> list[str]:
    """What differs between the runs of one comparison. `same_bits`: groups of commits that replicates
    showed to train bit for bit alike (`bitwise_commit_groups`); mixed commits within one group say so."""
    out = []
    gpus = sorted({str(r.info.get("gpu", "not recorded")) for r in runs})
    commits = sorted({short_commit(r) for r in runs})
    budgets = sorted({int(r.total) for r in runs})
    vals = sorted({r.val_label for r in runs})
    if len(gpus) > 1:
        out.append("mixed GPUs: " + ", ".join(gpus))
    if len(commits) > 1:
        vetted = any(set(commits) <= group for group in same_bits)
        note = " (replicates bitwise equal across them)" if vetted else ""
        out.append("mixed commits: " + ", ".join(commits) + note)
    if len(budgets) > 1:
        out.append("mixed token budgets: " + ", ".join(f"{b:,}" for b in budgets))
    if len(vals) > 1:
        out.append("mixed validation: " + "; ".join(vals))
    shared = sorted({int(r.info.get("runs_per_gpu", 1)) for r in runs if r.info})
    if shared and max(shared) > 1:
        out.append(f"{max(shared)} runs shared a GPU")
    det = [bool(r.info.get("deterministic", False)) for r in runs]
    out.append(
        "deterministic"
        if all(det)
        else ("not deterministic" if not any(det) else f"deterministic {sum(det)} of {len(det)} runs")
    )
    return out


def metric_text(metric: str, runs: list[RunData]) -> str:
    val = runs[0].val_label if runs else "in-training validation"
    n_eval = [r.eval_sequences for r in runs if r.eval_sequences]
    ev = (
        f"BF16 evaluation of the final checkpoint (eval.json, {min(n_eval)} sequences)"
        if n_eval
        else "BF16 evaluation of the final checkpoint (eval.json)"
    )
    return METRIC_TEXT[metric].format(val=val, eval=ev)


def claim_rows(
    exp: Experiment, runs: dict, summary: dict | None = None, same_bits: list[set[str]] = ()
) -> list[list[str]]:
    """The claims' rows of one experiment; `summary` collects (claim index) -> [(tier, experiment, n,
    verdict cell, ours)]; `same_bits` as for `flags`."""
    rows = []
    for index, c in enumerate(CLAIMS):
        if c.arm not in exp.arms or c.baseline not in exp.compared_arms:
            continue
        arm, base = arm_runs(runs, exp, c.arm), arm_runs(runs, exp, c.baseline)
        paired = [r for s in sorted(set(arm) & set(base)) for r in (arm[s], base[s])]
        interval, _ = compare(arm, base, c.metric)
        v = stats.verdict(interval, c.claim)
        if c.metric == "token_ratio" and interval is not None:
            # the interval is of (ratio - 1) in %: its 0 is a ratio of 1x
            v = replace(v, reason=v.reason.replace("0", "1x") if v.reason.endswith(" 0") else v.reason)
            ours = f"{1 + interval.mean / 100:.3f}x" + (
                ""
                if interval.lo is None
                else f" [{1 + interval.lo / 100:.3f}, {1 + interval.hi / 100:.3f}] (n={interval.n})"
            )
        else:
            ours = "not run" if interval is None else interval.text()
        size = paper_size(interval, c)
        rows.append(
            [
                f"{c.arm} vs {c.baseline}",
                metric_text(c.metric, paired),
                c.paper,
                ours,
                "no paired runs" if interval is None else v.text() + (f"; size: {size}" if size else ""),
                "; ".join(flags(paired, same_bits)) if paired else "—",
            ]
        )
        if summary is not None and interval is not None:
            budget = max(r.total for r in paired)
            cell = ours + (f"; {size}" if size else "")
            summary.setdefault(index, []).append((exp.tier, exp.name, interval.n, v.verdict, cell, budget))
    return rows


def paper_size(interval: stats.Interval | None, claim: ClaimRow) -> str:
    """Where the paper's own size of the gap lies against our interval ("" where the paper gives none or
    there is no interval): the verdict judges the direction or the bound, this the size."""
    if claim.paper_value is None or interval is None or interval.lo is None:
        return ""
    value = claim.paper_value
    where = "above" if value > interval.hi else "below" if value < interval.lo else "inside"
    shown = f"{1 + value / 100:.2f}x" if claim.metric == "token_ratio" else f"{value:+.1f}%"
    return f"the paper's {shown} lies {where} the interval"


# ---------------------------------------------------------------------------------------- figures
def relative_figure(exp: Experiment, runs: dict, path: Path) -> bool:
    """Per arm: the mean paired relative gap to the baseline with its 95% band, training loss (smoothed
    over 5% of the tokens) and in-training validation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = arm_runs(runs, exp, exp.baseline)
    arms = [a for a in exp.compared_arms if a != exp.baseline and set(arm_runs(runs, exp, a)) & set(base)]
    if not arms:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for arm_name in arms:
        arm = arm_runs(runs, exp, arm_name)
        seeds = sorted(set(arm) & set(base))
        for ax, kind in zip(axes, ("train", "val")):
            per_seed = []
            for s in seeds:
                gaps = stats.relative_gaps(getattr(arm[s], kind), getattr(base[s], kind))
                # a moving mean over 5% of the tokens (identical batches: the noise is the recipe's)
                if kind == "train":
                    total, ts = base[s].total, sorted(gaps)
                    gaps = {
                        t: sum(gaps[u] for u in ts if t - 0.05 * total < u <= t)
                        / max(1, sum(1 for u in ts if t - 0.05 * total < u <= t))
                        for t in ts
                    }
                per_seed.append(gaps)
            common = sorted(set.intersection(*(set(g) for g in per_seed))) if per_seed else []
            common = [t for t in common if t >= 0.05 * base[seeds[0]].total]
            if not common:
                continue
            intervals = [stats.mean_interval([g[t] for g in per_seed]) for t in common]
            x = [t / 1e6 for t in common]
            (line,) = ax.plot(x, [i.mean for i in intervals], label=f"{arm_name} (n={len(seeds)})")
            if len(seeds) > 1:
                ax.fill_between(
                    x, [i.lo for i in intervals], [i.hi for i in intervals], color=line.get_color(), alpha=0.2
                )
    for ax, title in zip(
        axes, ("training loss (identical batches), 5% moving mean", next(iter(base.values())).val_label)
    ):
        ax.axhline(0, color="black", linewidth=0.8)
        ax.axvspan(
            0.8 * next(iter(base.values())).total / 1e6, next(iter(base.values())).total / 1e6, color="grey", alpha=0.1
        )
        ax.set_xlabel("tokens (M)")
        ax.set_ylabel(f"(arm − {exp.baseline}) / {exp.baseline}, %")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{exp.name}: paired gap to {exp.baseline}, mean over seeds with 95% interval (decay shaded)", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------- report
def table(header: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[str(c).replace("|", "\\|") for c in row] for row in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in esc]


def setup_line(exp: Experiment, runs: dict) -> str:
    own = [r for a in exp.arms for r in arm_runs(runs, exp, a).values()]
    if not own:
        return f"No finished runs yet (`python -m nvfp4train.reproduce plan {exp.name}` lists them)."
    cfg = own[0].config
    _, non_embedding = model_params(cfg["model"])
    gpus = sorted({str(r.info.get("gpu", "not recorded")) for r in own})
    counts = {a: len(arm_runs(runs, exp, a)) for a in exp.compared_arms}
    arms = ", ".join(f"{a} ({n} seed{'' if n == 1 else 's'})" for a, n in counts.items())
    repeats = [r.repeats_from for r in own if r.repeats_from is not None]
    data = (
        f" The data starts repeating (a source's second pass) at {min(repeats) / 1e6:.1f}M tokens, "
        f"{100 * min(repeats) / own[0].total:.0f}% of the run: from there the training loss is on batches "
        "seen before."
        if repeats
        else ""
    )
    return (
        f"Model `{cfg['model']['name']}` ({non_embedding / 1e6:.1f}M non-embedding parameters), "
        f"{own[0].total:,.0f} tokens per run = {own[0].total / non_embedding:.2f} tokens per non-embedding "
        f"parameter. Baseline `{exp.baseline}`; arms with finished runs: {arms}. GPUs: {', '.join(gpus)}.{data}"
    )


def summary_lines(summary: dict) -> list[str]:
    """One row per claim: per tier, the verdict of its experiment with the most paired seeds (the most
    tokens among equals)."""
    rows = []
    for index, c in enumerate(CLAIMS):
        cells = []
        for tier in ("B", "A", "earlier"):
            found = sorted((e for e in summary.get(index, []) if e[0] == tier), key=lambda e: (-e[2], -e[5]))
            cells.append("not run" if not found else f"**{found[0][3]}**: {found[0][4]} ({found[0][1]})")
        rows.append(
            [
                f"{c.arm} vs {c.baseline}",
                METRIC_TEXT[c.metric].format(val="validation", eval="BF16 evaluation of the final checkpoint"),
                c.paper,
                *cells,
            ]
        )
    return (
        [
            "## Summary: the paper's claims",
            "",
            "Per tier, the experiment with the most paired seeds (the most tokens among equals); "
            "the sections below give every comparison, "
            "what its held-out figures are, and its flags.",
            "",
        ]
        + table(
            ["arms", "measure", "paper", "tier B (20 tokens/param)", "tier A (1.75 tokens/param)", "earlier runs"], rows
        )
        + [""]
    )


def left_out_lines(runs: dict, experiments: list[Experiment]) -> list[str]:
    """Finished runs that no experiment compares (an arm since removed from its experiment file)."""
    known = {(e.name, a) for e in experiments for a in e.arms}
    extra = sorted({f"{k[0]}/{k[1]}" for k in runs if (k[0], k[1]) not in known})
    if not extra:
        return []
    return [
        "## Runs not compared",
        "",
        "Finished runs whose arm no experiment file has any more: "
        + ", ".join(f"`{x}`" for x in extra)
        + ". (The earlier `mxfp4_1.36x` arm trained MXFP4 on 1.36x the tokens; at these budgets 36% more "
        "tokens is worth far more loss than any precision gap, so the token-equivalent replaces it.)",
        "",
    ]


SPREAD_PAIR = ("nvfp4", "fp8_blockwise")  # the comparison whose seed-to-seed spread is broken down
SPREAD_PARTS = 5


def spread_by_source(arm: dict[int, RunData], base: dict[int, RunData]) -> dict[str, list[float | None]]:
    """The SD between seeds of the paired in-training validation gap (%), per source and per fifth of
    the tokens: which sources and which part of training the windowed intervals' spread comes from."""
    seeds = sorted(s for s in set(arm) & set(base) if arm[s].val and base[s].val)
    if len(seeds) < 3:
        return {}
    sources = sorted(set.intersection(*(set(arm[s].val_sources) & set(base[s].val_sources) for s in seeds)))
    out = {}
    for source in [*sources, "mean"]:
        row = []
        for part in range(SPREAD_PARTS):
            lo, hi = part / SPREAD_PARTS, (part + 1) / SPREAD_PARTS
            gaps = []
            for s in seeds:
                a = arm[s].val if source == "mean" else arm[s].val_sources[source]
                b = base[s].val if source == "mean" else base[s].val_sources[source]
                points = [t for t in a if t in b and lo < t / arm[s].total <= hi]
                if points:
                    gaps.append(sum((a[t] - b[t]) / b[t] * 100.0 for t in points) / len(points))
            row.append(stats.mean_interval(gaps).sd if len(gaps) == len(seeds) else None)
        out[source] = row
    return out


def spread_lines(experiments: list[Experiment], runs: dict) -> list[str]:
    """Per tier, for its experiment with the most paired seeds of SPREAD_PAIR (one that runs the pair itself
    before one that borrows it): `spread_by_source` as a table."""
    lines = []
    for tier in ("B", "A"):
        best = None
        for exp in experiments:
            if exp.tier != tier or not {*SPREAD_PAIR} <= set(exp.arms) | set(exp.compared_arms):
                continue
            arm, base = arm_runs(runs, exp, SPREAD_PAIR[0]), arm_runs(runs, exp, SPREAD_PAIR[1])
            spread = spread_by_source(arm, base)
            n = len(set(arm) & set(base))
            own = exp.arm_source(SPREAD_PAIR[0]) == exp.name  # not borrowed from another experiment
            if spread and (best is None or (n, own) > best[1]):
                best = (exp, (n, own), spread)
        if best is None:
            continue
        exp, (n, _), spread = best
        parts = [f"{100 * k // SPREAD_PARTS}–{100 * (k + 1) // SPREAD_PARTS}%" for k in range(SPREAD_PARTS)]
        rows = [[source, *("" if v is None else f"{v:.2f}" for v in row)] for source, row in spread.items()]
        lines += [f"{exp.name} ({n} seeds):", "", *table(["source", *parts], rows), ""]
    if not lines:
        return []
    return [
        "## Where the spread between seeds comes from",
        "",
        f"The SD between seeds (in %) of the paired {SPREAD_PAIR[0]} − {SPREAD_PAIR[1]} gap in the in-training "
        "validation, per source and per fifth of the tokens. A source whose spread rises and falls again is "
        "one the runs of a seed learn at different moments (the arm that learns it first is ahead for a "
        "while, whichever precision it trains in); a window of the tables above that covers that stretch "
        "carries its spread into the interval, and a run that ends inside it carries it into the end point.",
        "",
        *lines,
    ]


def load_replicates(replicates_dir: Path) -> list[tuple[str, tuple, RunData]]:
    """(batch, run key, run) of every replicate under replicates_dir/<batch>/<experiment>/<arm>/seed<k>/."""
    batches = sorted(d for d in Path(replicates_dir).glob("*") if d.is_dir()) if Path(replicates_dir).is_dir() else []
    return [(b.name, key, rep) for b in batches for key, rep in sorted(load_runs([b]).items())]


def differing_steps(orig: RunData, rep: RunData) -> tuple[list, list]:
    """(the logged training steps both runs have, those of them whose losses differ)."""
    common = sorted(set(orig.train) & set(rep.train))
    return common, [t for t in common if orig.train[t] != rep.train[t]]


def bitwise_commit_groups(replicates: list[tuple[str, tuple, RunData]], runs: dict) -> list[set[str]]:
    """Commits linked by deterministic replicates whose every logged training loss equals the original's
    (the original's commit and the replicate's train the same bits), merged transitively: a run of one
    commit in a group would have given the same bits at any other commit of it."""
    groups: list[set[str]] = []
    for _, key, rep in replicates:
        orig = runs.get(key)
        if orig is None or not all(r.config.get("train", {}).get("deterministic") for r in (orig, rep)):
            continue
        common, differing = differing_steps(orig, rep)
        if not common or differing:
            continue
        linked = {short_commit(orig), short_commit(rep)}
        touching = [g for g in groups if g & linked]
        groups = [g for g in groups if not g & linked] + [linked.union(*touching)]
    return groups


def replicate_lines(replicates: list[tuple[str, tuple, RunData]], runs: dict) -> list[str]:
    """Runs made again (same command, a later batch; `load_replicates`) against the originals: with
    train.deterministic=true they must be bitwise equal; otherwise their difference is the run-to-run noise
    floor."""
    if not replicates:
        return []
    lines = [
        "## Replicates",
        "",
        "Runs made a second time, in a later batch of runs, compared with the original (`docs/results/"
        "replicates/<batch>/`, copied with `reproduce copy-results --to docs/results/replicates/<batch>`).",
        "",
        "| run | batch | GPU, commit (original / replicate) | deterministic | training loss at the logged steps | "
        "BF16 evaluation of the final checkpoint |",
        "|---|---|---|---|---|---|",
    ]
    for batch, key, rep in replicates:
        orig = runs.get(key)
        if orig is None:
            lines.append(f"| {'/'.join(map(str, key))} | {batch} | — | — | no original run | — |")
            continue
        common, differing = differing_steps(orig, rep)
        if not differing:
            train = f"identical at all {len(common)}"
        else:
            worst = max(abs(rep.train[t] / orig.train[t] - 1) for t in differing)
            train = (
                f"{len(differing)} of {len(common)} differ, from {differing[0] / 1e6:.1f}M tokens "
                f"(max {100 * worst:.3f}%)"
            )
        a, b = [r.eval.get("heldout_mean_loss") if r.eval else None for r in (orig, rep)]
        evaluation = (
            "—"
            if a is None or b is None
            else "identical"
            if a == b
            else f"{a:.6f} vs {b:.6f} ({100 * (b / a - 1):+.4f}%)"
        )
        where = " / ".join(f"{r.info.get('gpu', '?')}, {r.info.get('commit', '?')}" for r in (orig, rep))
        deterministic = "yes" if all(r.config.get("train", {}).get("deterministic") for r in (orig, rep)) else "no"
        lines.append(f"| {'/'.join(map(str, key))} | {batch} | {where} | {deterministic} | {train} | {evaluation} |")
    return lines + [""]


def write_report(
    results_dirs: list[Path], out: Path, experiments_dir: Path = EXPERIMENTS_DIR, figures: bool = True
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs([d for d in results_dirs if Path(d).is_dir()])
    experiments = all_experiments(experiments_dir)
    lines = [
        "# Reproduction: Pretraining LLMs with NVFP4 (arXiv 2509.25149), scaled down",
        "",
        "Generated by `python -m nvfp4train.reproduce report` from the finished runs under "
        + ", ".join(f"`{d}/`" for d in results_dirs)
        + "; the experiments are "
        "`configs/reproduce/*.yaml`.",
        "",
        "How to read it: runs are **paired by seed** (one seed = the same initial weights and the same "
        "batches in every arm). Gap = (arm − baseline) / baseline of the loss in %, positive = the arm is "
        "worse, computed per seed and averaged over a window of the training tokens (stable phase 20–80%, "
        "decay 80–100%); the table gives the mean over seeds, its 95% interval (Student's t) and the SD "
        "between seeds. Verdict: *reproduced* when the interval lies on the paper's side and excludes 0, "
        "*contradicted* when it lies on the other side, *unresolved* otherwise (with the seeds a paired "
        "t-test at α = 0.05 would need for power 0.8 at the observed SD); one seed gives no interval. The "
        "verdict judges the direction (or the bound) the paper states; where the paper also gives a size, "
        "the row says whether that size lies inside our interval. "
        "Held-out figures are either the **in-training validation** (at the precision it names, N "
        "sequences per source) or the **BF16 evaluation of the final checkpoint** (eval.json, the whole "
        "validation split or N sequences); flags name what differs between the paired runs.",
        "",
    ]
    body, summary = [], {}
    replicates = load_replicates(out / "replicates")
    same_bits = bitwise_commit_groups(replicates, runs)
    for tier in ("B", "A", "earlier"):
        exps = [e for e in experiments if e.tier == tier]
        if not exps:
            continue
        planned = sum(len(arm.seeds) for exp in exps for arm in exp.arms.values())
        finished = sum(len(arm_runs(runs, exp, name)) for exp in exps for name in exp.arms)
        lines_tier = [
            f"## {TIER_TITLES[tier]}",
            "",
            f"{finished} of the {planned} runs its experiments plan are finished "
            "(`python -m nvfp4train.reproduce status` lists each).",
            "",
        ]
        for exp in exps:
            lines_tier += [f"### {exp.name}: {exp.description}", "", setup_line(exp, runs), ""]
            rows = claim_rows(exp, runs, summary, same_bits)
            if rows:
                lines_tier += table(
                    ["arms", "measure", "paper", "here: paired gap, 95% interval", "verdict", "flags"], rows
                ) + [""]
            if figures and relative_figure(exp, runs, out / "reproduction" / f"{exp.name}.png"):
                lines_tier += [f"![{exp.name}: paired relative gap](reproduction/{exp.name}.png)", ""]
        body += lines_tier
    lines += summary_lines(summary) + body + left_out_lines(runs, experiments)
    lines += replicate_lines(replicates, runs)
    lines += spread_lines(experiments, runs)
    lines += [
        "## Where this scale differs from the paper's",
        "",
        "- Tokens per parameter: the paper's 12B saw ~800 tokens per parameter (10T tokens), its 8B ~125 and "
        "its 1.2B ablations ~1,300; here tier A is at 1.75 and tier B at 20. Quantization error has less "
        'time to accumulate, and the paper warns that "smaller models trained on shorter token horizons may '
        'not require all of these techniques" (§4).',
        "- Model size: 5–23M non-embedding parameters against 1.2–12B; the BF16 blocks are the last 2 of 12 "
        "(17% of the linears, as the 12B's 16%).",
        "- FP4 is emulated on Hopper (no FP4 tensor cores), bit-exact with Transformer Engine's reference "
        "quantizer; the FP8 baseline is the paper's blockwise recipe.",
        "- Data: a few tens of millions of tokens from offline sources (data/README.md), in the paper's three "
        "phases; the longer runs pass over a source up to ~4 times (each experiment's setup line says where "
        "repetition begins), the paper's data never repeats. Gaps measured after that point include how well "
        "each precision fits data it has seen before, which the paper's runs never measure.",
        "- Token efficiency: the token-equivalent reads the better run's in-training validation curve (at "
        "the worse run's final loss), which is under a WSD schedule: a loss reached during the decay is "
        "reached sooner than a run of fewer tokens (with its own decay) would, so the ratio is closer to 1x "
        "than the paper's measure (separate runs at several budgets) would be.",
        "",
    ]
    path = out / "reproduction.md"
    path.write_text("\n".join(lines))
    return path
