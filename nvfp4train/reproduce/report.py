"""docs/results/reproduction.md (+ figures) from whatever runs are finished under the results dirs.

One row per claim of the paper (arXiv 2509.25149) and experiment: the paper's value, ours as a paired
95% interval over seeds (stats.py) with its seed count, the verdict, and flags where the paired runs
differ in GPU model, commit, token budget, corpus or evaluation. Held-out numbers say what they are: the
in-training validation (at the precision it names, N sequences per source) or the BF16 evaluation of
the final checkpoint (eval.json).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from nvfp4train.reproduce import stats
from nvfp4train.reproduce.claims import CLAIMS_FILE, Claim, Endpoint, Kind, Loss, Point, Precision, load_claims
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
    val_tp: dict[float, float] = field(default_factory=dict)  # val_tp/mean (train.eval_precision=both)
    blend_changes: list[float] = field(default_factory=list)  # tokens at which data/phase changes

    @property
    def val_label(self) -> str:
        t = self.config.get("train", {})
        precision = "BF16" if t.get("eval_precision") in ("bf16", "both") else "training precision"
        return f"in-training validation ({precision}, {t.get('eval_sequences', '?')} seq/source)"

    @property
    def val_tp_label(self) -> str:
        sequences = self.config.get("train", {}).get("eval_sequences", "?")
        return f"in-training validation (training precision, {sequences} seq/source)"

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
    train, val, val_sources, val_tp, blend_changes, repeats_from, phase = {}, {}, {}, {}, [], None, None
    for r in run.metrics.records:
        tokens = float(r.get("tokens", r["step"] * per_step))
        if isinstance(r.get("val_tp/mean"), (int, float)):
            val_tp[tokens] = float(r["val_tp/mean"])
        if isinstance(r.get("data/phase"), int) and not isinstance(r["data/phase"], bool):
            if phase is not None and r["data/phase"] != phase:
                blend_changes.append(tokens)
            phase = r["data/phase"]
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
        val_tp,
        blend_changes,
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
    """The finished runs `exp` compares as `arm`, by seed: its own, or those of the experiment it borrows them
    from (`Experiment.source`); of a sweep's borrowed cell, only the cell's seeds (the lender may run more)."""
    source = exp.source(arm)
    own = exp.arms.get(arm)
    seeds = own.seeds if own is not None and own.borrow is not None else None
    return {k[2]: r for k, r in runs.items() if (k[0], k[1]) == source and (seeds is None or k[2] in seeds)}


# ------------------------------------------------------------------------------------- statistics
def _eval_precision(run: RunData) -> str:
    return str(run.config.get("train", {}).get("eval_precision", "training"))


def held_curve(run: RunData, precision: Precision) -> dict[float, float] | None:
    """The in-training validation curve in `precision`, None where the run did not record it: val/ is in
    BF16 with train.eval_precision=bf16 or both, in the training precision otherwise; val_tp/ (both) is in
    the training precision."""
    ep = _eval_precision(run)
    if precision is Precision.BF16:
        return run.val if ep in ("bf16", "both") and run.val else None
    if ep == "both":
        return run.val_tp or None
    return run.val if ep != "bf16" and run.val else None


def final_eval(run: RunData, precision: Precision) -> float | None:
    """The final checkpoint's held-out mean loss (unweighted over sources) in `precision`: eval.json's
    heldout is at its eval_precision (BF16 for bf16 and both), heldout_tp in the training precision."""
    e = run.eval
    if not e:
        return None
    ep = str(e.get("eval_precision", "bf16"))
    if precision is Precision.TRAINING and isinstance(e.get("heldout_tp"), dict) and e["heldout_tp"]:
        if isinstance(e.get("heldout_tp_mean_loss"), (int, float)):  # the same mean as heldout_mean_loss's
            return float(e["heldout_tp_mean_loss"])
        losses = [float(v["loss"]) for v in e["heldout_tp"].values()]
        return sum(losses) / len(losses)
    if (precision is Precision.BF16) == (ep in ("bf16", "both")) and e.get("heldout_mean_loss") is not None:
        return float(e["heldout_mean_loss"])
    return None


@dataclass
class Measured:
    """Per seed: the paired gap in % (pct) and in nats (nats) of one endpoint; what was measured (label);
    why nothing was, where nothing was (missing)."""

    pct: dict[int, float]
    nats: dict[int, float]
    label: str
    missing: str | None = None


def _fresh_end(runs: list[RunData]) -> float | None:
    """Tokens at which the first data source begins its second pass, over the paired runs (None: never)."""
    repeats = [r.repeats_from for r in runs if r.repeats_from is not None]
    return min(repeats) if repeats else None


def _nearest(curve: dict[float, float], tokens: float) -> float:
    return min(curve, key=lambda t: abs(t - tokens))


def measure(ep: Endpoint, arm: dict[int, RunData], base: dict[int, RunData]) -> Measured:
    """The endpoint's paired gaps, seed by seed."""
    seeds = sorted(set(arm) & set(base))
    label = ep.text()
    if not seeds:
        return Measured({}, {}, label, "no paired runs")
    runs = [r for s in seeds for r in (arm[s], base[s])]
    total = base[seeds[0]].total
    if ep.loss is Loss.FINAL_EVAL:
        a = {s: final_eval(arm[s], ep.precision) for s in seeds}
        b = {s: final_eval(base[s], ep.precision) for s in seeds}
        lacking = sum(1 for s in seeds for v in (a[s], b[s]) if v is None)
        if lacking:
            key = "heldout_tp" if ep.precision is Precision.TRAINING else "heldout (BF16)"
            return Measured(
                {}, {}, label, f"{lacking} of {2 * len(seeds)} eval.json lack {key} (evaluate with both precisions)"
            )
        sizes = sorted({r.eval_sequences for r in runs if r.eval_sequences})
        if sizes:
            label += f" (eval.json, {sizes[0]} sequences)"
        return Measured({s: (a[s] - b[s]) / b[s] * 100.0 for s in seeds}, {s: a[s] - b[s] for s in seeds}, label)
    if ep.loss is Loss.TRAINING:
        curves = {s: (arm[s].train, base[s].train) for s in seeds}
        lo, hi = ep.window if ep.window else (0.95, 1.0)
        fresh = _fresh_end(runs)
        end = min(hi, fresh / total) if fresh is not None else hi
        if end <= lo:
            where = f"the first data repeat at {fresh / 1e6:.1f}M tokens ({100 * fresh / total:.0f}%)"
            if ep.after_repeat is None:
                return Measured({}, {}, label, f"the window starts past {where}")
            m = measure(ep.after_repeat, arm, base)
            m.label += f" (the training-loss window lies past {where})"
            return m
        if end < hi:
            label = label.replace(f"{round(100 * hi)}% of tokens", f"{100 * end:.0f}% of tokens, the first repeat")
        window = (lo, end)
    else:
        curves = {s: (held_curve(arm[s], ep.precision), held_curve(base[s], ep.precision)) for s in seeds}
        lacking = sum(1 for s in seeds for c in curves[s] if c is None)
        if lacking:
            name = "val_tp/" if ep.precision is Precision.TRAINING else "val/ in BF16"
            return Measured(
                {}, {}, label, f"{lacking} of {2 * len(seeds)} runs lack {name} (train.eval_precision=both records it)"
            )
        vals = sorted({f"{r.config.get('train', {}).get('eval_sequences', '?')}" for r in runs})
        label += f" ({'/'.join(vals)} seq/source)"
        window = ep.window
    pct, nats = {}, {}
    for s in seeds:
        a, b = curves[s]
        rel = stats.relative_gaps(a, b)
        diff = {t: a[t] - b[t] for t in rel}
        if not rel:
            continue
        if ep.point is Point.FINAL:
            t = max(rel)
            pct[s], nats[s] = rel[t], diff[t]
        elif ep.point is Point.CHANGE:
            t0, t1 = _nearest(rel, window[0] * total), _nearest(rel, window[1] * total)
            pct[s], nats[s] = rel[t1] - rel[t0], diff[t1] - diff[t0]
        else:
            value = stats.window_mean(rel, total, window)
            if value is not None:
                pct[s], nats[s] = value, stats.window_mean(diff, total, window)
    return Measured(pct, nats, label, None if pct else "no logged point inside the window")


def _interval_text(values: list[float], unit: str, digits: int) -> str:
    i = stats.mean_interval(values)
    if i.lo is None:
        return f"{i.mean:+.{digits}f}{unit} (1 seed)"
    return f"{i.mean:+.{digits}f}{unit} [{i.lo:+.{digits}f}, {i.hi:+.{digits}f}]"


def gap_text(m: Measured) -> str:
    """Mean, 95% interval, n, in % and in nats."""
    seeds = sorted(m.pct)
    return (
        f"{_interval_text([m.pct[s] for s in seeds], '%', 2)}, "
        f"{_interval_text([m.nats[s] for s in seeds], ' nats', 4)} (n={len(seeds)})"
    )


@dataclass
class ClaimResult:
    claim: Claim
    exp: Experiment
    verdict: stats.Verdict
    ours: str
    label: str
    n: int
    paired: list[RunData]
    decomposition: list[list[str]] = field(default_factory=list)


def _with_need(v: stats.Verdict) -> str:
    return v.text()


def evaluate(claim: Claim, exp: Experiment, runs: dict) -> ClaimResult:
    """The claim's test on one experiment's runs."""
    arm, base = arm_runs(runs, exp, claim.arm), arm_runs(runs, exp, claim.baseline)
    paired = [r for s in sorted(set(arm) & set(base)) for r in (arm[s], base[s])]
    ep = claim.endpoint
    if claim.kind is Kind.TOKEN_EQUIVALENT:
        return _token_equivalent(claim, exp, runs, paired)
    if claim.kind is Kind.FRACTION_RECOVERED:
        ref = arm_runs(runs, exp, claim.reference)
        gap, switched = measure(ep, base, ref), measure(ep, arm, ref)
        missing = gap.missing or switched.missing
        if missing:
            return ClaimResult(
                claim, exp, stats.Verdict(stats.UNRESOLVED, missing), "not measured", gap.label, 0, paired
            )
        seeds = sorted(set(gap.pct) & set(switched.pct))
        recovered = [gap.pct[s] - switched.pct[s] for s in seeds]
        v, ratio = stats.judge_fraction(recovered, [gap.pct[s] for s in seeds], claim.fraction)
        rec = Measured(
            {s: -r for s, r in zip(seeds, recovered)}, {s: switched.nats[s] - gap.nats[s] for s in seeds}, ""
        )
        ours = f"fraction {ratio.text()}" if ratio else "—"
        ours += (
            f"; {claim.arm} − {claim.baseline} {gap_text(rec)}; {claim.baseline} − {claim.reference} {gap_text(gap)}"
        )
        result = ClaimResult(claim, exp, v, ours, gap.label, len(seeds), paired)
    else:
        m = measure(ep, arm, base)
        if m.missing:
            return ClaimResult(
                claim, exp, stats.Verdict(stats.UNRESOLVED, m.missing), "not measured", m.label, 0, paired
            )
        values = [m.pct[s] for s in sorted(m.pct)]
        if claim.kind is Kind.BOUND:
            v = stats.judge_bound(values, claim.bound)
        elif claim.kind is Kind.SIZE:
            v = stats.judge_size(values, claim.value)
        elif claim.kind is Kind.DIRECTION:
            v = stats.judge_direction(values, claim.side, claim.effect)
        else:
            v = stats.judge_equivalence(values, claim.margin)
        result = ClaimResult(claim, exp, v, gap_text(m), m.label, len(values), paired)
    result.decomposition = decomposition_rows(claim, arm, base)
    return result


def decomposition_rows(claim: Claim, arm: dict[int, RunData], base: dict[int, RunData]) -> list[list[str]]:
    """Where the runs have the held-out loss in both precisions: the gap in the training precision split
    into its weight-quality part (the gap in BF16) and its forward-quantization part (training precision −
    BF16), each with its paired interval. Nothing where either precision is missing."""
    ep = claim.endpoint.after_repeat or claim.endpoint
    if ep.loss is Loss.TRAINING or not claim.primary:
        return []
    tp = measure(replace(ep, precision=Precision.TRAINING), arm, base)
    bf = measure(replace(ep, precision=Precision.BF16), arm, base)
    if tp.missing or bf.missing:
        return []
    seeds = sorted(set(tp.pct) & set(bf.pct))
    forward = Measured({s: tp.pct[s] - bf.pct[s] for s in seeds}, {s: tp.nats[s] - bf.nats[s] for s in seeds}, "")
    where = replace(ep, precision=Precision.BF16).text().replace(" in BF16", "")
    return [
        [f"{claim.arm} vs {claim.baseline}", f"{where}: gap in the training precision", gap_text(tp)],
        [f"{claim.arm} vs {claim.baseline}", f"{where}: weight quality (the gap in BF16)", gap_text(bf)],
        [
            f"{claim.arm} vs {claim.baseline}",
            f"{where}: forward quantization (training precision − BF16)",
            gap_text(forward),
        ],
    ]


def _token_equivalent(claim: Claim, exp: Experiment, runs: dict, paired: list[RunData]) -> ClaimResult:
    """Per seed, the budget k at which the arm's final loss (runs at k x the tokens, own schedules)
    reaches the baseline's at 1x (or 1 / the baseline's k for the arm's, where the arm ends better)."""
    ep = claim.endpoint
    label = f"{ep.text()}, interpolated over separate runs at {', '.join(f'{k:g}x' for k in claim.arm_budgets)}"
    budget_runs = {a: arm_runs(runs, exp, a) for a in {*claim.arm_budgets.values(), *claim.baseline_budgets.values()}}
    missing = sorted(a for a, r in budget_runs.items() if not r)
    if missing:
        reason = (
            f"missing: the separate-budget runs of {', '.join(missing)} (experiment {exp.name}; "
            f"`python -m nvfp4train.reproduce plan {exp.name}` lists them)"
        )
        return ClaimResult(claim, exp, stats.Verdict(stats.UNRESOLVED, reason), "not run", label, 0, paired)
    seeds = sorted(set.intersection(*(set(r) for r in budget_runs.values())))
    base_total = budget_runs[claim.baseline_budgets[1.0]][seeds[0]].total if seeds else 1.0
    per_seed, beyond = {}, []
    for s in seeds:

        def finals(budgets):
            return {
                budget_runs[a][s].total / base_total: final_eval(budget_runs[a][s], ep.precision)
                for a in budgets.values()
            }

        arm_f, base_f = finals(claim.arm_budgets), finals(claim.baseline_budgets)
        if None in arm_f.values() or None in base_f.values():
            reason = "the budget runs' eval.json lack the endpoint's precision"
            return ClaimResult(claim, exp, stats.Verdict(stats.UNRESOLVED, reason), "not measured", label, 0, paired)
        if arm_f[min(arm_f)] >= base_f[min(base_f)]:
            k = stats.budget_to_reach(arm_f, base_f[min(base_f)])
        else:
            k = stats.budget_to_reach(base_f, arm_f[min(arm_f)])
            k = 1 / k if k else None
        if k is None:
            beyond.append(s)
        else:
            per_seed[s] = (k - 1) * 100
    if beyond:
        reason = f"seeds {beyond}: beyond the largest budget (add a larger one)"
        return ClaimResult(claim, exp, stats.Verdict(stats.UNRESOLVED, reason), "not measured", label, 0, paired)
    values = [per_seed[s] for s in sorted(per_seed)]
    v = stats.judge_size(values, (claim.ratio - 1) * 100)
    i = stats.mean_interval(values)
    ours = f"{1 + i.mean / 100:.3f}x" + ("" if i.lo is None else f" [{1 + i.lo / 100:.3f}, {1 + i.hi / 100:.3f}]")
    return ClaimResult(claim, exp, v, ours + f" (n={len(values)})", label, len(values), paired)


def short_commit(run: RunData) -> str:
    return str(run.info.get("commit", "not recorded"))[:10]


def corpus_label(run: RunData) -> str:
    """The corpus a run trained on, in 8 hex digits (of its run.json `corpus`: each data file's sha256), or
    "unknown" for a run recorded before run.json had it."""
    corpus = run.info.get("corpus")
    if not isinstance(corpus, dict) or not corpus:
        return "unknown"
    return hashlib.sha256(json.dumps(corpus, sort_keys=True).encode()).hexdigest()[:8]


def mixed_corpora(runs: list[RunData]) -> str | None:
    """The flag for runs of one comparison that trained on different corpora, with the files that differ;
    None where they agree. Runs that do not record theirs count as one corpus, "unknown", so that they are
    flagged only beside runs that do."""
    labels: dict[str, int] = {}
    for r in runs:
        labels[corpus_label(r)] = labels.get(corpus_label(r), 0) + 1
    if len(labels) < 2:
        return None
    known = [r.info["corpus"] for r in runs if corpus_label(r) != "unknown"]
    splits = sorted({k for c in known for k in c if len({c2.get(k) for c2 in known}) > 1})
    counted = ", ".join(f"{label} ({n} run{'s' if n > 1 else ''})" for label, n in sorted(labels.items()))
    return f"mixed corpora: {counted}" + (f", differing in {' and '.join(splits)}" if splits else "")


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
    if corpora := mixed_corpora(runs):
        out.append(corpora)
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


def applies(claim: Claim, exp: Experiment) -> bool:
    """A claim is tested on an experiment that compares every arm it needs and runs one of them itself."""
    needed = claim.arms_needed
    return all(a in exp.compared_arms for a in needed) and any(a in exp.arms for a in needed)


def evaluate_all(claims: tuple[Claim, ...], experiments: list[Experiment], runs: dict) -> list[ClaimResult]:
    return [evaluate(c, e, runs) for e in experiments for c in claims if applies(c, e)]


def primary_family(results: list[ClaimResult]) -> dict[tuple[str, str], ClaimResult]:
    """Per tier and primary claim, the result the summary shows (the experiment with the most paired
    seeds, then the most tokens), with Holm's correction over the tier's family of them applied."""
    chosen = {}
    for r in results:
        if not r.claim.primary:
            continue
        key = (r.exp.tier, r.claim.id)
        budget = max((p.total for p in r.paired), default=0)
        rank = (r.n, budget)
        if key not in chosen or rank > chosen[key][0]:
            chosen[key] = (rank, r)
    out = {k: v[1] for k, v in chosen.items()}
    for tier in {k[0] for k in out}:
        keys = [k for k in out if k[0] == tier]
        adjusted = stats.apply_holm([out[k].verdict for k in keys])
        for k, v in zip(keys, adjusted):
            out[k] = replace(out[k], verdict=v)
    return out


def _significance(v: stats.Verdict) -> str:
    if v.p is None:
        return ""
    adjusted = f", Holm-adjusted p = {v.p_adjusted:.3g}" if v.p_adjusted is not None else ""
    return f"p = {v.p:.3g}{adjusted}"


def claim_rows(results: list[ClaimResult], family: dict, same_bits: list[set[str]] = ()) -> list[list[str]]:
    """One experiment's rows: the primary ones that the summary shows carry the Holm-adjusted verdict; every
    other row is exploratory (its verdict uncorrected)."""
    rows = []
    for r in results:
        shown = family.get((r.exp.tier, r.claim.id))
        primary = shown is not None and shown.exp.name == r.exp.name
        v = shown.verdict if primary else r.verdict
        sig = _significance(v)
        rows.append(
            [
                f"{r.claim.arm} vs {r.claim.baseline}",
                r.label,
                f"{r.claim.paper} [{r.claim.kind.value}: {r.claim.paper_value}]",
                r.ours,
                f"**{v.verdict}** ({v.text()[len(v.verdict) + 2 : -1]}" + (f"; {sig})" if sig else ")"),
                "primary" if primary else "exploratory",
                "; ".join(flags(r.paired, same_bits)) if r.paired else "—",
            ]
        )
    return rows


def summary_lines(claims: tuple[Claim, ...], results: list[ClaimResult], family: dict) -> list[str]:
    """One primary row per claim of the paper (per tier: verdict, ours, significance), then the
    exploratory rows, marked."""

    def cell(r: ClaimResult | None, v: stats.Verdict | None = None) -> str:
        if r is None:
            return "not run"
        v = v or r.verdict
        sig = _significance(v)
        why = "" if r.n else f" ({v.reason})"
        return f"**{v.verdict}**{why}: {r.ours}" + (f"; {sig}" if sig else "") + f" ({r.exp.name})"

    tiers = ("B", "A", "earlier")
    header = ["paper's claim", "kind", "paper's value", "measure (primary endpoint)"]
    header += ["tier B (20 tokens/param)", "tier A (1.75 tokens/param)", "earlier runs"]
    primary = [
        [c.paper, c.kind.value, c.paper_value, c.endpoint.text(), *(cell(family.get((t, c.id))) for t in tiers)]
        for c in claims
        if c.primary
    ]
    exploratory = []
    for c in claims:
        if c.primary:
            continue
        cells = []
        for t in tiers:
            found = sorted(
                (r for r in results if r.claim.id == c.id and r.exp.tier == t),
                key=lambda r: (-r.n, -max((p.total for p in r.paired), default=0)),
            )
            cells.append(cell(found[0] if found else None))
        exploratory.append([f"*exploratory*: {c.paper}", c.kind.value, c.paper_value, c.endpoint.text(), *cells])
    return [
        "## Summary: the paper's claims",
        "",
        "One primary row per claim of the paper, its test and primary endpoint as fixed in "
        "`configs/reproduce/claims/paper.yaml` before the runs. Per tier, the experiment with the most "
        "paired seeds (the most tokens among equals). Significance: the p-value of the test the verdict "
        "rests on, and Holm's adjustment over that tier's primary rows (a verdict whose adjusted p is not "
        "below 0.05 is *unresolved*). The exploratory rows below them are not in that family and are not "
        "corrected. The sections below give every comparison, its held-out figures and its flags.",
        "",
        *table(header, primary),
        "",
        *table(header, exploratory),
        "",
    ]


# ---------------------------------------------------------------------------------------- figures
def _switch_at(run: RunData) -> float | None:
    switch = (run.config.get("precision") or {}).get("switch") or {}
    at = switch.get("at_fraction") if isinstance(switch, dict) else None
    return float(at) * run.total if isinstance(at, (int, float)) and at > 0 else None


def relative_figure(exp: Experiment, runs: dict, path: Path) -> bool:
    """Per arm: the mean paired relative gap to the reference with its pointwise 95% band, training loss
    (smoothed over 5% of the tokens) and in-training validation, in BF16 and, where every run recorded it
    (train.eval_precision=both), in the training precision too; vertical lines at the first data repeat,
    the blend changes and the switch. Switch experiments plot switch − NVFP4 (the tested effect); more than
    two arms get one panel each (small multiples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own_switch = [a for a in exp.arms if any(_switch_at(r) for r in arm_runs(runs, exp, a).values())]
    reference = "nvfp4" if own_switch and "nvfp4" in exp.compared_arms else exp.baseline
    base = arm_runs(runs, exp, reference)
    arms = [a for a in exp.compared_arms if a != reference and set(arm_runs(runs, exp, a)) & set(base)]
    if own_switch:
        arms = [a for a in arms if a in own_switch]
    if not arms:
        return False
    panels = [[a] for a in arms] if len(arms) > 2 else [arms]
    any_run = next(iter(base.values()))
    plotted = list(base.values()) + [r for a in arms for r in arm_runs(runs, exp, a).values()]
    kinds = ["train", "val"]
    titles = ["training loss (identical batches), 5% moving mean", any_run.val_label]
    if _eval_precision(any_run) == "both" and all(r.val_tp for r in plotted):
        kinds.append("val_tp")
        titles.append(any_run.val_tp_label)
    fig, axes = plt.subplots(len(kinds), len(panels), figsize=(6 * len(panels), 3.75 * len(kinds)), squeeze=False)
    total = any_run.total
    for col, panel in enumerate(panels):
        for arm_name in panel:
            arm = arm_runs(runs, exp, arm_name)
            seeds = sorted(set(arm) & set(base))
            for row, kind in enumerate(kinds):
                ax = axes[row][col]
                per_seed = []
                for s in seeds:
                    gaps = stats.relative_gaps(getattr(arm[s], kind), getattr(base[s], kind))
                    if kind == "train":  # a moving mean over 5% of the tokens (identical batches)
                        ts = sorted(gaps)
                        gaps = {
                            t: sum(gaps[u] for u in ts if t - 0.05 * total < u <= t)
                            / max(1, sum(1 for u in ts if t - 0.05 * total < u <= t))
                            for t in ts
                        }
                    per_seed.append(gaps)
                common = sorted(set.intersection(*(set(g) for g in per_seed))) if per_seed else []
                common = [t for t in common if t >= 0.05 * total]
                if not common:
                    continue
                intervals = [stats.mean_interval([g[t] for g in per_seed]) for t in common]
                x = [t / 1e6 for t in common]
                (line,) = ax.plot(x, [i.mean for i in intervals], label=f"{arm_name} − {reference} (n={len(seeds)})")
                if len(seeds) > 1:
                    ax.fill_between(
                        x,
                        [i.lo for i in intervals],
                        [i.hi for i in intervals],
                        color=line.get_color(),
                        alpha=0.2,
                        label="pointwise 95% interval",
                    )
        paired = [r for a in panel for r in arm_runs(runs, exp, a).values()] + list(base.values())
        fresh = _fresh_end(paired)
        blends = sorted({t for r in paired for t in r.blend_changes})
        switches = sorted({t for r in paired if (t := _switch_at(r))})
        for row, title in enumerate(titles):
            ax = axes[row][col]
            ax.axhline(0, color="black", linewidth=0.8)
            ax.axvspan(0.8 * total / 1e6, total / 1e6, color="grey", alpha=0.1)
            if fresh is not None:
                ax.axvline(fresh / 1e6, color="red", linestyle=":", linewidth=1, label="first data repeat")
            for i, t in enumerate(blends):
                ax.axvline(
                    t / 1e6, color="green", linestyle="--", linewidth=0.8, label="blend change" if i == 0 else None
                )
            for i, t in enumerate(switches):
                ax.axvline(
                    t / 1e6, color="purple", linestyle="-.", linewidth=1, label="switch to BF16" if i == 0 else None
                )
            ax.set_xlabel("tokens (M)")
            ax.set_ylabel(f"(arm − {reference}) / {reference}, %")
            ax.set_title(title, fontsize=9)
            ax.legend(fontsize=7)
    fig.suptitle(
        f"{exp.name}: paired gap to {reference}\nmean over seeds, pointwise 95% band, LR decay shaded", fontsize=10
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


def side_by_side_lines(exp: Experiment, runs: dict) -> list[str]:
    """Every arm against the experiment's baseline on the final checkpoint's evaluation, in BF16 and in the
    training precision, paired by seed, and the arm's own forward-quantization part: a description of all the
    arms in one place (the claims above test some pairs), for experiments of three arms or more."""
    compared = exp.compared_arms
    if len(compared) < 3:
        return []
    base = arm_runs(runs, exp, exp.baseline)
    rows = []
    for name in compared[1:]:
        arm = arm_runs(runs, exp, name)
        cells = []
        for precision in (Precision.BF16, Precision.TRAINING):
            m = measure(Endpoint(Loss.FINAL_EVAL, precision, Point.FINAL), arm, base)
            seeds = sorted(m.pct)
            cells.append(_interval_text([m.pct[s] for s in seeds], "%", 2) if seeds else "not measured")
        parts = []
        for run in arm.values():
            bf16, tp = final_eval(run, Precision.BF16), final_eval(run, Precision.TRAINING)
            if bf16 and tp is not None:
                parts.append((tp - bf16) / bf16 * 100.0)
        paired = len(set(arm) & set(base))
        if not paired:
            continue
        own = f"{_interval_text(parts, '%', 2)} (n={len(parts)})" if parts else "not measured"
        rows.append([f"{name} vs {exp.baseline}", str(paired), *cells, own])
    if not rows:
        return []
    return [
        f"Every arm against {exp.baseline}, side by side (descriptive, no test: the claims above are the tests): the "
        "final checkpoint's evaluation on the whole validation split (eval.json, the unweighted mean over "
        "sources), the paired gap's mean over seeds and its 95% interval, and the arm's own forward "
        "quantization (its training-precision loss − its BF16 loss, in % of the BF16 loss).",
        "",
        *table(
            ["arms", "paired seeds", "gap, BF16 forward", "gap, training-precision forward", "forward quantization"],
            rows,
        ),
        "",
    ]


def left_out_lines(runs: dict, experiments: list[Experiment]) -> list[str]:
    """Finished runs that no experiment compares (an arm since removed from its experiment file); a sweep's
    learning-rate scan (`tune-lr`, <sweep>_lr) is not one of them: its table is tune-lr's."""
    known = {(e.name, a) for e in experiments for a in e.arms}
    scans = {f"{e.name}_lr" for e in experiments if e.sweep is not None}
    extra = sorted({f"{k[0]}/{k[1]}" for k in runs if (k[0], k[1]) not in known and k[0] not in scans})
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
    results_dirs: list[Path],
    out: Path,
    experiments_dir: Path = EXPERIMENTS_DIR,
    figures: bool = True,
    claims_file: Path | None = None,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    results_dirs = [d for d in results_dirs if Path(d).is_dir()]
    runs = load_runs(results_dirs)
    experiments = all_experiments(experiments_dir)
    sweeps = [e for e in experiments if e.sweep is not None]  # their own section: a fit, not claims
    experiments = [e for e in experiments if e.sweep is None]
    # an experiments directory without claims of its own is judged against the paper's claims
    own_claims = Path(experiments_dir) / "claims" / CLAIMS_FILE.name
    claims = load_claims(claims_file or (own_claims if own_claims.exists() else CLAIMS_FILE))
    results = evaluate_all(claims, experiments, runs)
    if figures:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            figures = None
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
        "worse (the paper's figures plot the opposite sign), per seed, with the same difference in nats "
        "beside it; the tables give the mean over seeds, its 95% interval (Student's t) and n. Each claim's "
        'kind decides its test: *bound* ("< 1%"): the one-sided 95% bound against the paper\'s; *size* '
        '("≈ 1.5%"): **reproduced** where the sign is right and the paper\'s value lies inside the 95% '
        "interval, **direction only** where the sign is right and it lies outside; *direction*: the interval "
        "on the paper's side of 0; *equivalence*: two one-sided tests against the margin the claims file "
        "states, printed beside the minimum detectable effect; *fraction recovered* (the switches): the "
        "fraction of the NVFP4 − FP8 gap recovered, with Fieller's 95% interval, against the paper's; "
        "*token equivalent*: interpolated over separate runs at 1, 1.15, 1.3 and 1.5x the tokens. "
        "**Contradicted**: the interval on the other side; **unresolved**: otherwise, with the seeds a "
        "paired t-test (α = 0.05, power 0.8) would need at the observed SD, or with what is missing. "
        "A training-loss window ends at the first repeat of any data source; past it the claims use the "
        "held-out loss. Held-out figures name their precision: the **training precision** (what the "
        "forward pass of training computes) or **BF16** (every GEMM in BF16: the weights' quality without "
        "the forward pass's quantization error).",
        "",
    ]
    body = []
    replicates = load_replicates(out / "replicates")
    same_bits = bitwise_commit_groups(replicates, runs)
    family = primary_family(results)
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
            own = [r for r in results if r.exp.name == exp.name]
            rows = claim_rows(own, family, same_bits)
            if rows:
                lines_tier += table(
                    [
                        "arms",
                        "measure",
                        "paper [kind: value]",
                        "here: paired gap, 95% interval",
                        "verdict",
                        "role",
                        "flags",
                    ],
                    rows,
                ) + [""]
            parts = [row for r in own for row in r.decomposition]
            if parts:
                lines_tier += [
                    "Gap decomposition (exploratory): the gap in the training precision = weight quality (the gap in "
                    "BF16) + forward quantization (training precision − BF16), per seed.",
                    "",
                    *table(["arms", "part", "paired gap, 95% interval"], parts),
                    "",
                ]
            lines_tier += side_by_side_lines(exp, runs)
            if figures and relative_figure(exp, runs, out / "reproduction" / f"{exp.name}.png"):
                lines_tier += [f"![{exp.name}: paired relative gap](reproduction/{exp.name}.png)", ""]
        body += lines_tier
    for exp in sweeps:
        from nvfp4train.reproduce.forecast import report_lines

        body += report_lines(exp, runs, out, bool(figures))
    if figures is None:
        lines += [
            "Figures: not drawn, matplotlib is not installed (`pip install 'nvfp4train[plots]'` and run the "
            "report again).",
            "",
        ]
    lines += summary_lines(claims, results, family) + body + left_out_lines(runs, experiments + sweeps)
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
        "- Token efficiency: the token equivalent is measured as the paper measures it, from separate runs at "
        "1, 1.15, 1.3 and 1.5x the tokens, each with its own schedule. At 20 tokens per parameter the loss "
        "still falls faster with tokens than at the paper's ~125, so the same gap in % is closed by a smaller "
        "token ratio here.",
        "",
    ]
    path = out / "reproduction.md"
    path.write_text("\n".join(lines))
    return path
