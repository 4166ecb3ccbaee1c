"""A sweep's section of the report (tables, the fitted law, the slopes per decade, figures) and
`python -m nvfp4train.reproduce predict`, both from scaling.py's fit of the sweep's finished runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from nvfp4train.reproduce import stats
from nvfp4train.reproduce.experiments import EXPERIMENTS_DIR, Experiment, UsageError, all_experiments
from nvfp4train.reproduce.scaling import (
    EXTRAPOLATION_LIMIT,
    LAW_PARAMS,
    SweepFit,
    count_text,
    fit_sweep,
    interval_text,
    parse_count,
    predict,
    sweep_cells,
)

EVALUATIONS = {"bf16": "evaluated in BF16", "training": "evaluated in the training precision"}
PAPER_QUESTION = ("nemotron_h_12b", 10e12)  # the paper's 12B model and its 10T tokens


def compared(exp: Experiment) -> list[str]:
    return [a for a in exp.sweep.arms if a != exp.baseline]


def fits(exp: Experiment, runs: dict, bootstrap: int) -> dict[str, tuple[SweepFit, str]]:
    """Per evaluation with cells to fit: the fit and what was measured."""
    out = {}
    for evaluation in EVALUATIONS:
        cells, source = sweep_cells(exp, runs, evaluation)
        cells = [c for c in cells if len(c.losses.get(exp.baseline, {})) >= 2]
        if cells and any(a in c.losses for c in cells for a in compared(exp)):
            out[evaluation] = (fit_sweep(cells, exp.baseline, compared(exp), bootstrap=bootstrap), source)
    return out


def _direction(point: float, lo: float, hi: float, what: str) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{what}: not measured (one value on this axis, or too few cells)"
    if lo > 0:
        return f"{what}: the gap grows"
    if hi < 0:
        return f"{what}: the gap shrinks"
    return f"{what}: not resolved (the interval holds 0)"


def preset_params(name: str) -> float | None:
    """The non-embedding parameters of configs/model/<name>.yaml, None where there is no such preset."""
    import yaml

    from nvfp4train.reproduce.plan import model_params

    path = EXPERIMENTS_DIR.parent / "model" / f"{name}.yaml"
    if name not in {p.stem for p in path.parent.glob("*.yaml")}:  # a preset's name, never a path
        return None
    return float(model_params(yaml.safe_load(path.read_text()))[1])


def prediction_lines(fit: SweepFit, arm: str, n: float, d: float) -> list[str]:
    p = predict(fit, arm, n, d)
    c = fit.point.c.get(arm, math.nan)
    lines = [
        f"  law (Kumar et al., N_eff = c·N): gap {interval_text(*p.law_pct)} "
        f"({interval_text(*p.law_nats, unit=' nats', digits=4)}), c = {c:.3g} "
        f"[{fit.c_interval(arm)[0]:.3g}, {fit.c_interval(arm)[1]:.3g}]"
        if fit.point.law
        else "  law: not fitted (it needs six or more cells of distinct size or budget)",
        f"  trend (gap in % over log10 N and log10 D/N): {interval_text(*p.trend_pct)}{_unmeasured_axes(fit, arm, p)}",
    ]
    return lines


def _unmeasured_axes(fit: SweepFit, arm: str, p) -> str:
    """Why a trend prediction is missing: the axes the cells measured at one value, which the question leaves."""
    if math.isfinite(p.trend_pct[0]):
        return ""
    slopes = fit.point.trend_pct.get(arm)
    if slopes is None:
        return ""
    axes = [name for name, slope in (("N", slopes[1]), ("D/N", slopes[2])) if not math.isfinite(slope)]
    if not axes:
        return ""
    them = "them" if len(axes) > 1 else "it"
    measured = " and of ".join(axes)
    return f" (the sweep measured one value of {measured}: no slope along {them} to carry the gap off {them})"


def _distance_text(fit: SweepFit, n: float, d: float) -> str:
    dn, dr = fit.distance(n, d)
    ns, rs = [c.n for c in fit.cells], [c.tokens_per_param for c in fit.cells]
    where = f"the sweep measured N {count_text(min(ns))}–{count_text(max(ns))}, D/N {min(rs):.3g}–{max(rs):.3g}"
    if dn == 0 and dr == 0:
        return f"inside the measured range ({where})"
    return f"extrapolated {dn:.2f} decade(s) of N and {dr:.2f} of D/N beyond it ({where})"


# ---------------------------------------------------------------------------------------- report
def _cell_rows(fit: SweepFit, arm: str) -> list[list[str]]:
    rows = []
    for cell in fit.cells:
        base, own = cell.losses[fit.baseline], cell.losses.get(arm, {})
        seeds = sorted(set(base) & set(own))
        if not seeds:
            continue
        nats = stats.mean_interval([own[s] - base[s] for s in seeds])
        pct = stats.mean_interval([100 * (own[s] - base[s]) / base[s] for s in seeds])
        rows.append(
            [
                cell.size,
                count_text(cell.n),
                f"{cell.budget:g}",
                str(len(seeds)),
                nats.text(" nats", 4),
                pct.text("%", 2),
            ]
        )
    return rows


def _figure(exp: Experiment, fit: SweepFit, evaluation: str, path: Path) -> bool:
    """Gap (%) against N and against D/N: the measured cells (mean and 95% interval over seeds), the law
    and the trend with their bootstrap bands; and the law's residuals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ns = sorted({c.n for c in fit.cells})
    rs = sorted({c.budget for c in fit.cells})
    common_r = max(rs, key=lambda r: sum(1 for c in fit.cells if c.budget == r))
    common_n = max(ns, key=lambda n: sum(1 for c in fit.cells if c.n == n))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, arm in enumerate(fit.arms):
        colour = colours[k % len(colours)]
        for ax, axis in ((axes[0], "n"), (axes[1], "r")):
            chosen = [c for c in fit.cells if (c.budget == common_r if axis == "n" else c.n == common_n)]
            xs, ys, es = [], [], []
            for c in chosen:
                own, base = c.losses.get(arm, {}), c.losses[fit.baseline]
                seeds = sorted(set(own) & set(base))
                if len(seeds) < 2:
                    continue
                i = stats.mean_interval([100 * (own[s] - base[s]) / base[s] for s in seeds])
                xs.append(c.n if axis == "n" else c.tokens_per_param)
                ys.append(i.mean)
                es.append(i.hi - i.mean)
            if not xs:
                continue
            ax.errorbar(xs, ys, yerr=es, fmt="o", color=colour, label=f"{arm} (measured, 95% over seeds)")
            lo_x, hi_x = min(xs) / 2, max(xs) * 2
            grid = np.geomspace(lo_x, hi_x, 60)
            n = grid if axis == "n" else np.full_like(grid, common_n)
            d = grid * common_r if axis == "n" else grid * common_n
            for model, style in (("law", "-"), ("trend", "--")):
                point, lo, hi = fit.curve(arm, n, d, model, "%")
                if np.isfinite(point).any():
                    ax.plot(grid, point, style, color=colour, label=f"{arm} {model}" if axis == "n" else None)
                    ax.fill_between(grid, lo, hi, color=colour, alpha=0.12 if model == "law" else 0.06)
        res = fit.residuals(arm)
        if res and fit.point.law:
            axes[2].plot([c.n for c, _, _ in res], [r for _, _, r in res], "o", color=colour, label=arm)
    axes[0].set(xscale="log", xlabel=f"N, non-embedding parameters (at D/N = {common_r:.3g})", ylabel="gap to BF16, %")
    axes[1].set(xscale="log", xlabel=f"D/N, tokens per parameter (at N = {count_text(common_n)})", ylabel="gap, %")
    axes[2].set(xscale="log", xlabel="N", ylabel="measured − law, % (residual)")
    for ax in axes:
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # the decades only: no overlapping labels
        ax.axhline(0, color="grey", lw=0.6)
        ax.grid(alpha=0.3)
    for ax in (axes[0], axes[2]):
        if ax.get_legend_handles_labels()[1]:  # no residuals without a fitted law: no legend to draw
            ax.legend(fontsize=7)
    fig.suptitle(
        f"{exp.name}: gap to {fit.baseline}, {EVALUATIONS[evaluation]}; bands: {fit.level:.0%} paired bootstrap "
        "over seeds (law: solid, trend: dashed)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report_lines(exp: Experiment, runs: dict, out: Path, figures: bool, bootstrap: int = 400) -> list[str]:
    from nvfp4train.reproduce.report import arm_runs, table

    planned = sum(len(arm.seeds) for arm in exp.arms.values())
    finished = sum(len(arm_runs(runs, exp, name)) for name in exp.arms)
    lenders: dict[str, int] = {}  # the borrowed runs, by the experiment that makes them
    for arm in exp.arms.values():
        if arm.borrow is not None:
            lenders[arm.borrow[0]] = lenders.get(arm.borrow[0], 0) + len(arm.seeds)
    parts = [f"{n} of them {name}'s" for name, n in lenders.items()]
    borrowed = f" ({', '.join(parts)})" if parts else ""
    lines = [
        f"## Sweep {exp.name}: {exp.description}",
        "",
        f"{finished} of the {planned} runs it plans{borrowed} are finished (`python -m nvfp4train.reproduce status "
        f"{exp.name}` shows the grid). Each cell is one size N (non-embedding parameters) at one budget D; "
        "the gap is the arm's final loss minus BF16's, paired by seed. The law is Kumar et al. 2024's "
        "L = A·(c·N)^−α + B·D^−β + E (c = 1 for BF16; c < 1: the precision is worth fewer parameters), the "
        "trend a plane of the gap (%) in log10 N and log10 D/N; both carry 95% intervals from a paired "
        "bootstrap over seeds (nvfp4train/reproduce/scaling.py).",
        "",
    ]
    found = fits(exp, runs, bootstrap)
    if not found:
        return lines + [
            f"No cell has two finished seeds of {exp.baseline} and of another arm yet: "
            f"`python -m nvfp4train.reproduce run {exp.name}` makes them (smallest cells first).",
            "",
        ]
    for evaluation, (fit, source) in found.items():
        title = EVALUATIONS[evaluation]
        lines += [f"### {title[0].upper()}{title[1:]} ({source})", ""]
        for arm in fit.arms:
            rows = _cell_rows(fit, arm)
            if rows:
                lines += [
                    f"{arm} against {fit.baseline}, per cell (mean over seeds, 95% interval, Student's t):",
                    "",
                    *table(["cell", "N", "D/N", "seeds", "gap, nats", "gap, %"], rows),
                    "",
                ]
        if fit.point.law:
            law = fit.point.law
            rows = [[k, f"{law[k]:.4g}", "[{:.4g}, {:.4g}]".format(*fit.law_interval(k))] for k in LAW_PARAMS]
            rows += [
                [f"c ({arm})", f"{fit.point.c.get(arm, math.nan):.3g}", "[{:.3g}, {:.3g}]".format(*fit.c_interval(arm))]
                for arm in fit.arms
            ]
            edge = fit.edge()
            lines += [
                "The law (A, α, B, β, E from the BF16 cells; c per precision from the paired gaps):",
                "",
                *table(["parameter", "fit", "95% interval"], rows),
                "",
            ]
            if edge:
                lines += [f"{' and '.join(edge)} at the end of the searched range: not identified by these cells.", ""]
        else:
            lines += ["The law is not fitted: it needs six or more cells of distinct size or budget.", ""]
        rows, words = [], []
        for arm in fit.arms:
            sn, sr = fit.slope(arm, "n"), fit.slope(arm, "r")
            nn, nr = fit.slope(arm, "n", "nats"), fit.slope(arm, "r", "nats")
            rows.append(
                [
                    arm,
                    interval_text(*sn, unit=" %"),
                    interval_text(*sr, unit=" %"),
                    interval_text(*nn, unit="", digits=4),
                    interval_text(*nr, unit="", digits=4),
                ]
            )
            words.append(f"{arm}: {_direction(*sn, 'with size')}; {_direction(*sr, 'with tokens per parameter')}.")
        lines += [
            "The gap's slope per decade (the trend), 95% interval:",
            "",
            *table(
                [
                    "arm",
                    "per decade of N, %",
                    "per decade of D/N, %",
                    "per decade of N, nats",
                    "per decade of D/N, nats",
                ],
                rows,
            ),
            "",
            *words,
            "",
        ]
        name, tokens = PAPER_QUESTION
        n = preset_params(name)
        if n is not None:
            for arm in fit.arms:
                if arm in fit.point.trend_pct:
                    lines += [
                        f"`python -m nvfp4train.reproduce predict model={name} tokens=10T precision={arm} "
                        f"--extrapolate` (the paper's 12B, {count_text(n)} non-embedding parameters, at 10T tokens): "
                        f"{_distance_text(fit, n, tokens)}:",
                        "",
                        *[line.strip() for line in prediction_lines(fit, arm, n, tokens)],
                        "",
                    ]
        if figures:
            path = out / "reproduction" / f"{exp.name}_{evaluation}.png"
            if _figure(exp, fit, evaluation, path):
                lines += [f"![{exp.name}: the gap against N and D/N](reproduction/{path.name})", ""]
    return lines


# ------------------------------------------------------------------------------------------ predict
def predict_command(
    words: list[str],
    runs_dirs: list[Path],
    experiments_dir: Path = EXPERIMENTS_DIR,
    experiment: str | None = None,
    extrapolate: bool = False,
    bootstrap: int = 400,
) -> list[str]:
    """The lines `predict` prints; UsageError (one line) for bad words, a question past the limit without
    extrapolate, or no sweep runs."""
    from nvfp4train.reproduce.report import load_runs

    allowed = ("model", "tokens", "precision")
    given = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or key not in allowed:
            raise UsageError(
                f"predict: {word!r}; expected {'=..., '.join(allowed)}=... "
                "(e.g. model=hybrid_1b tokens=20B precision=nvfp4)"
            )
        given[key] = value
    missing = [k for k in allowed if k not in given]
    if missing:
        raise UsageError(f"predict: {missing[0]}= missing; expected model=<preset or N> tokens=<D> precision=<arm>")
    sweeps = [e for e in all_experiments(experiments_dir) if e.sweep is not None]
    if experiment is not None:
        sweeps = [e for e in sweeps if e.name == experiment]
        if not sweeps:
            raise UsageError(f"predict: --experiment {experiment}: no sweep of that name in {experiments_dir}")
    if not sweeps:
        raise UsageError(
            f"predict: no sweep experiment in {experiments_dir} (configs/reproduce/sweep_size.yaml is one)"
        )
    if len(sweeps) > 1:
        raise UsageError(f"predict: several sweeps ({', '.join(e.name for e in sweeps)}): name one with --experiment")
    exp = sweeps[0]
    arm = given["precision"]
    if arm not in compared(exp):
        raise UsageError(
            f"predict: precision={arm!r}; allowed: the arms of {exp.name} compared with {exp.baseline}: "
            + ", ".join(compared(exp))
        )
    n = preset_params(given["model"])
    if n is None:
        n = parse_count(given["model"])
    if n is None:
        presets = sorted(p.stem for p in (EXPERIMENTS_DIR.parent / "model").glob("*.yaml"))
        raise UsageError(
            f"predict: model={given['model']!r}; expected a preset ({', '.join(presets)}) or a number of "
            "non-embedding parameters (e.g. 1.2e10 or 12B)"
        )
    d = parse_count(given["tokens"])
    if d is None:
        raise UsageError(
            f"predict: tokens={given['tokens']!r}; expected a number of training tokens (e.g. 2e11, 200B, 10T)"
        )
    runs = load_runs([p for p in runs_dirs if Path(p).is_dir()])
    found = fits(exp, runs, bootstrap)
    found = {e: v for e, v in found.items() if arm in v[0].point.trend_pct}
    if not found:
        raise UsageError(
            f"predict: no finished runs of {exp.name} with two or more seeds of {exp.baseline} and {arm} in a cell "
            f"under {', '.join(map(str, runs_dirs))}: make them with `python -m nvfp4train.reproduce run {exp.name}` "
            f"(then `copy-results {exp.name}` to commit them), or point --runs-dir at them"
        )
    fit = next(iter(found.values()))[0]
    dn, dr = fit.distance(n, d)
    if max(dn, dr) > EXTRAPOLATION_LIMIT and not extrapolate:
        ns, rs = [c.n for c in fit.cells], [c.tokens_per_param for c in fit.cells]
        raise UsageError(
            f"predict: N={count_text(n)}, D/N={d / n:.3g} lies {dn:.2f} decade(s) of N and {dr:.2f} of D/N outside "
            f"{exp.name}'s cells (N {count_text(min(ns))}–{count_text(max(ns))}, D/N {min(rs):.3g}–{max(rs):.3g}); "
            f"past {EXTRAPOLATION_LIMIT} decade a fit is not a measurement: --extrapolate prints its interval anyway"
        )
    lines = [
        f"{arm} against {exp.baseline} at N = {count_text(n)} non-embedding parameters, D = {count_text(d)} tokens "
        f"(D/N = {d / n:.3g}), from {exp.name}: {_distance_text(fit, n, d)}"
    ]
    for evaluation, (fit, source) in found.items():
        cells = [c for c in fit.cells if arm in c.losses]
        seeds = sorted({len(c.losses[arm]) for c in cells})
        lines.append(
            f" {EVALUATIONS[evaluation]} ({source}; {len(cells)} cells, {seeds[0]}–{seeds[-1]} seeds), "
            f"{fit.level:.0%} intervals from a paired bootstrap over seeds:"
        )
        lines += prediction_lines(fit, arm, n, d)
    return lines
