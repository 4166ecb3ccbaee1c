"""The numbers of a comparison: smoothed loss curves per arm (mean and min-max over seeds), the relative
difference to the baseline, gaps at the milestones, held-out losses, stability signals and the
downstream table. Everything returned is plain JSON data; the report draws and prints only from it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from nvfp4train.compare.runs import Arm, Run, budget

# Record keys the training loop may write; absent keys are reported as not recorded.
PEAK_MEMORY_KEY = "peak_mem_gib"
CHECKPOINT_TIME_KEY = "checkpoint_time_s"


def train_curve(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, loss) of the applied steps with a finite loss, sorted by tokens, duplicates dropped."""
    points = {}
    for r in run.records:
        loss = r.get("loss")
        if loss is None or r.get("step_skipped") or not math.isfinite(float(loss)) or "tokens" not in r:
            continue
        points[int(r["tokens"])] = float(loss)
    tokens = np.array(sorted(points), dtype=float)
    return tokens, np.array([points[int(t)] for t in tokens], dtype=float)


def smooth(tokens: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """Trailing mean over the last `window` tokens (the point itself included): no look-ahead, so the
    value at a phase switch is not blurred by what comes after it; works for uneven spacing."""
    out = np.empty_like(values)
    for i, t in enumerate(tokens):
        mask = (tokens > t - window) & (tokens <= t)
        out[i] = values[mask].mean()
    return out


def arm_curve(arm: Arm, window: float) -> dict:
    """Mean and min-max of the arm's smoothed per-seed curves on the union of their token points; a
    seed contributes only inside its own range (runs of different lengths, missing steps)."""
    per_run = []
    for run in arm.runs:
        t, v = train_curve(run)
        if len(t):
            per_run.append((t, smooth(t, v, window)))
    grid = np.unique(np.concatenate([t for t, _ in per_run]))
    stack = np.full((len(per_run), len(grid)), np.nan)
    for i, (t, v) in enumerate(per_run):
        inside = (grid >= t[0]) & (grid <= t[-1])
        stack[i, inside] = np.interp(grid[inside], t, v)
    with warnings.catch_warnings():  # a grid point no seed covers stays NaN ("mean of empty slice")
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, lo, hi = np.nanmean(stack, 0), np.nanmin(stack, 0), np.nanmax(stack, 0)
    return {"tokens": grid, "mean": mean, "min": lo, "max": hi, "seeds": (~np.isnan(stack)).sum(0)}


def at(curve: dict, key: str, tokens: float) -> float | None:
    """A curve's value at `tokens` (linear interpolation), None outside its range."""
    t = curve["tokens"]
    if not len(t) or tokens < t[0] or tokens > t[-1]:
        return None
    return float(np.interp(tokens, t, curve[key]))


def relative_curve(arm: dict, base: dict) -> dict:
    """(arm - baseline) / baseline in % on the arm's points inside the baseline's range, with the band of
    the arm's seeds against the baseline mean."""
    t = arm["tokens"]
    inside = (t >= base["tokens"][0]) & (t <= base["tokens"][-1]) if len(base["tokens"]) else t < 0
    t = t[inside]
    b = np.interp(t, base["tokens"], base["mean"])
    rel = lambda key: (arm[key][inside] - b) / b * 100  # noqa: E731
    return {"tokens": t, "mean": rel("mean"), "min": rel("min"), "max": rel("max")}


def spread_pct(curve: dict, tokens: float) -> float | None:
    """Seed-to-seed spread (max - min) / mean in % at `tokens`; None with one seed."""
    i = np.searchsorted(curve["tokens"], tokens)
    seeds = curve["seeds"][min(i, len(curve["seeds"]) - 1)] if len(curve["seeds"]) else 0
    lo, hi, mean = at(curve, "min", tokens), at(curve, "max", tokens), at(curve, "mean", tokens)
    if seeds < 2 or mean is None:
        return None
    return (hi - lo) / mean * 100


def heldout(arm: Arm) -> dict:
    """The arm's held-out losses at the last token count every seed evaluated: mean over seeds per source."""
    per_run = []
    for run in arm.runs:
        evals = {
            int(r["tokens"]): {k[4:]: float(v) for k, v in r.items() if k.startswith("val/")}
            for r in run.records
            if "val/mean" in r and "tokens" in r
        }
        per_run.append(evals)
    common = set.intersection(*(set(e) for e in per_run)) if per_run else set()
    if not common:
        return {}
    tokens = max(common)
    sources = sorted(set.intersection(*(set(e[tokens]) for e in per_run)))
    return {
        "tokens": tokens,
        "loss": {s: float(np.mean([e[tokens][s] for e in per_run])) for s in sources},
        "min": {s: float(min(e[tokens][s] for e in per_run)) for s in sources},
        "max": {s: float(max(e[tokens][s] for e in per_run)) for s in sources},
    }


def stability(run: Run) -> dict:
    """What an adopter checks per run; keys the run did not record are None."""
    recs = [r for r in run.records if "loss" in r]
    speeds = [float(r["tokens_per_s"]) for r in recs[1:] if "tokens_per_s" in r]  # the first step compiles/warms up
    norms = [float(r["grad_norm"]) for r in recs if r.get("grad_norm") is not None]
    finite_norms = [n for n in norms if math.isfinite(n)]
    mems = [float(r[PEAK_MEMORY_KEY]) for r in run.records if r.get(PEAK_MEMORY_KEY) is not None]
    ckpt = [float(r[CHECKPOINT_TIME_KEY]) for r in run.records if r.get(CHECKPOINT_TIME_KEY) is not None]
    # The loop's running counters, or the flagged records where a history has no counters.
    skipped = max(
        [int(r.get("skipped_steps", 0)) for r in run.records] + [sum(bool(r.get("step_skipped")) for r in run.records)]
    )
    spikes = max(
        [int(r.get("loss_spikes", 0)) for r in run.records] + [sum(bool(r.get("loss_spike")) for r in run.records)]
    )
    return {
        "run": run.name,
        "source": run.source,
        "last_step": int(max(r.get("step", 0) for r in run.records)),
        "last_tokens": int(max(r.get("tokens", 0) for r in run.records)),
        "final_loss": float(recs[-1]["loss"]) if recs else None,
        "skipped_steps": int(skipped),
        "loss_spikes": int(spikes),
        "grad_norm_max": max(finite_norms) if finite_norms else None,
        "grad_norm_median": float(np.median(finite_norms)) if finite_norms else None,
        "nonfinite_grad_norms": len(norms) - len(finite_norms),
        "tokens_per_s": float(np.median(speeds)) if speeds else None,
        "peak_mem_gib": max(mems) if mems else None,
        "checkpoint_time_s": float(np.mean(ckpt)) if ckpt else None,
    }


def eval_table(arms: list[Arm]) -> dict:
    """Table 2 style: per task (primary metric) and held-out source, the mean over the arm's seeds that
    have an eval.json, per arm label."""
    rows: dict[str, dict] = {}
    for arm in arms:
        evals = [r.eval for r in arm.runs if r.eval]
        if not evals:
            continue
        values: dict[str, list] = {}
        for e in evals:
            for task, v in e.get("tasks", {}).items():
                values.setdefault(f"{task} ({v['primary']})", []).append(v[v["primary"]])
            n = e.get("heldout_sequences")  # eval.json of this version on: say which held-out set it is
            sequences = f", {n} sequences" if n else ""
            heldout = "training-precision" if e.get("eval_precision") == "train" else "BF16"
            for section, precision in (("heldout", heldout), ("heldout_tp", "training-precision")):
                for source, v in e.get(section, {}).items():
                    values.setdefault(f"held-out {source} (loss; {precision} evaluation{sequences})", []).append(
                        v["loss"]
                    )
        for name, vals in values.items():
            rows.setdefault(name, {})[arm.label] = {"mean": float(np.mean(vals)), "seeds": len(vals)}
    return rows


def compare(arms: list[Arm], baseline: Arm, milestones: list[dict], window_fraction: float) -> dict:
    """Every number of the comparison, as JSON data (arrays as lists)."""
    total = budget(baseline.runs[0]) or max(int(r.get("tokens", 0)) for run in baseline.runs for r in run.records)
    window = max(window_fraction * total, 1.0)
    curves = {arm.label: arm_curve(arm, window) for arm in arms}
    base = curves[baseline.label]
    out = {
        "baseline": baseline.label,
        "smoothing_window_tokens": window,
        "markers": milestones,
        "arms": [],
        "gaps": [],
        "heldout": {},
        "stability": {},
        "eval": eval_table(arms),
        "curves": {},
    }
    for arm in arms:
        c = curves[arm.label]
        out["arms"].append(
            {
                "label": arm.label,
                "runs": [r.source for r in arm.runs],
                "seeds": len(arm.runs),
                "key": arm.key,  # held-out sequences per source of the in-training evaluation
                "eval_sequences": (arm.runs[0].config.get("train") or {}).get("eval_sequences"),
            }
        )
        rel = relative_curve(c, base)
        out["curves"][arm.label] = {
            "train_tokens": c["tokens"].tolist(),
            "train_loss_mean": c["mean"].tolist(),
            "train_loss_min": c["min"].tolist(),
            "train_loss_max": c["max"].tolist(),
            "relative_tokens": rel["tokens"].tolist(),
            "relative_pct_mean": rel["mean"].tolist(),
            "relative_pct_min": rel["min"].tolist(),
            "relative_pct_max": rel["max"].tolist(),
            "grad_norm": {
                run.name: [
                    [r["tokens"], r["grad_norm"]]
                    for r in run.records
                    if r.get("grad_norm") is not None and "tokens" in r
                ]
                for run in arm.runs
            },
            "tokens_per_s": {
                run.name: [
                    [r["tokens"], r["tokens_per_s"]]
                    for r in run.records
                    if r.get("tokens_per_s") is not None and "tokens" in r
                ][1:]
                for run in arm.runs
            },
            "events": {
                run.name: [
                    [r["tokens"], r.get("loss"), "skipped" if r.get("step_skipped") else "spike"]
                    for r in run.records
                    if (r.get("step_skipped") or r.get("loss_spike")) and "tokens" in r
                ]
                for run in arm.runs
            },
            "heldout_points": {
                run.name: [[r["tokens"], r["val/mean"]] for r in run.records if "val/mean" in r and "tokens" in r]
                for run in arm.runs
            },
        }
        out["heldout"][arm.label] = heldout(arm)
        out["stability"][arm.label] = [stability(r) for r in arm.runs]
        if arm is baseline:
            continue
        for m in milestones:
            T = m["tokens"]
            # "end of run": the last point both arms reached, when a run stopped short of its budget.
            if m["kind"] == "end":
                T = min(T, float(c["tokens"][-1]), float(base["tokens"][-1]))
            a, b = at(c, "mean", T), at(base, "mean", T)
            gap = (a - b) / b * 100 if a is not None and b is not None else None
            base_spread, arm_spread = spread_pct(base, T), spread_pct(c, T)
            out["gaps"].append(
                {
                    "arm": arm.label,
                    "milestone": m["label"],
                    "tokens": T,
                    "arm_loss": a,
                    "baseline_loss": b,
                    "gap_pct": gap,
                    "baseline_spread_pct": base_spread,
                    "arm_spread_pct": arm_spread,
                    "exceeds_baseline_spread": (abs(gap) > base_spread)
                    if gap is not None and base_spread is not None
                    else None,
                }
            )
        hb, ha = out["heldout"][baseline.label], out["heldout"][arm.label]
        if hb and ha and hb["tokens"] == ha["tokens"]:
            ha["relative_pct"] = {
                s: (ha["loss"][s] - hb["loss"][s]) / hb["loss"][s] * 100 for s in ha["loss"] if s in hb["loss"]
            }
    return out
