"""The 4-bit gap as a function of model size and tokens per parameter: a precision-aware scaling law fitted
to a sweep's runs, with seed-level uncertainty, and the predictions `reproduce predict` makes from it.

Two descriptions of the same cells (a cell: one model size N, non-embedding parameters, and one token
budget D; in it every arm runs the same seeds):

- The law, Kumar et al. 2024 ("Scaling Laws for Precision", arXiv 2411.04330, eq. 2 with the precision
  entering through an effective parameter count):

      L_p(N, D) = A * (c_p * N)^-alpha + B * D^-beta + E,        c_bf16 = 1

  A, alpha, B, beta and E are fitted to the BF16 arm's losses (for fixed alpha and beta the law is linear
  in A, B and E: a grid over the exponents, refined, with least squares for the rest); then c_p, the
  effective-parameter multiplier of precision p against BF16, from the paired gaps
  L_p - L_bf16 = A * N^-alpha * (c_p^-alpha - 1) (least squares for c_p^-alpha - 1, in closed form).
  c_p < 1: training in p is worth fewer parameters than BF16. In this form the gap in nats depends on N
  only; a dependence on D/N (as Quartet II reports for NVFP4) shows in the residuals and in the trend.
- The trend: the paired gap in % (and in nats) as a plane in log10 N and log10 D/N, fitted by least
  squares over the cells. Its two slopes, in % per decade of N and per decade of D/N, say whether the
  gap shrinks or grows with size and with tokens per parameter.

Uncertainty: a paired bootstrap over seeds. Each replicate draws, in every cell, the seeds with
replacement, the same draws for every arm (so the arms stay paired), and refits everything. A draw of n
seeds has a spread smaller than the seeds' by sqrt((n-1)/n) (a third too narrow at n = 3), so each draw's
deviation from the cell's mean is scaled by sqrt(n/(n-1)), which makes the replicates' variance of a cell
mean the usual s^2/n. Intervals are the bootstrap percentiles; at 3 seeds per cell a nominal 90% one
holds a known law's values in 80-93% of synthetic sweeps (tests/reproduce/test_sweep.py).

Pure numbers here (numpy only); `sweep_cells` reads them from the report's runs.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
BOOTSTRAP = 400
EXTRAPOLATION_LIMIT = 0.5  # decades of N or of D/N outside the sweep past which `predict` needs --extrapolate
LAW_PARAMS = ("A", "alpha", "B", "beta", "E")
ALPHA_RANGE = (0.02, 2.0)  # the exponents searched; a fit at an end of it is said to be at the edge


@dataclass
class Cell:
    """One (size, budget) point: n non-embedding parameters, d training tokens, and per arm the final
    loss of each seed."""

    size: str
    n: float
    d: float
    losses: dict[str, dict[int, float]]
    nominal: float | None = None  # the sweep's tokens per parameter (d / n differs by the rounding to steps)

    @property
    def tokens_per_param(self) -> float:
        return self.d / self.n

    @property
    def budget(self) -> float:
        """The tokens per parameter the cell was planned at, to group cells by."""
        return self.nominal if self.nominal is not None else float(f"{self.d / self.n:.3g}")


# ---------------------------------------------------------------------------------------- the fits
def _law_exponents(ln: np.ndarray, ld: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of y (R, m): alpha, beta and (A', B', E) of y = A' e^(-alpha ln) + B' e^(-beta ld) + E by
    least squares (variable projection: a grid over the exponents, refined three times around the best),
    every row at once."""
    rows = np.arange(len(y))

    def best(alphas, betas):  # alphas (R, Ga), betas (R, Gb)
        xn = np.exp(-alphas[..., None] * ln)  # (R, Ga, m)
        xd = np.exp(-betas[..., None] * ld)  # (R, Gb, m)
        r, ga, gb = len(y), alphas.shape[1], betas.shape[1]
        gram = np.empty((r, ga, gb, 3, 3))  # the normal equations of [xn, xd, 1], from sums
        gram[..., 0, 0] = (xn * xn).sum(-1)[:, :, None]
        gram[..., 1, 1] = (xd * xd).sum(-1)[:, None, :]
        gram[..., 0, 1] = gram[..., 1, 0] = np.einsum("ram,rbm->rab", xn, xd)
        gram[..., 0, 2] = gram[..., 2, 0] = xn.sum(-1)[:, :, None]
        gram[..., 1, 2] = gram[..., 2, 1] = xd.sum(-1)[:, None, :]
        gram[..., 2, 2] = len(ln)
        gram += 1e-12 * np.eye(3)
        rhs = np.empty((r, ga, gb, 3))
        rhs[..., 0] = np.einsum("ram,rm->ra", xn, y)[:, :, None]
        rhs[..., 1] = np.einsum("rbm,rm->rb", xd, y)[:, None, :]
        rhs[..., 2] = y.sum(-1)[:, None, None]
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
        sse = (y * y).sum(-1)[:, None, None] - (coef * rhs).sum(-1)  # at the least-squares solution
        flat = sse.reshape(r, -1).argmin(1)
        i, j = np.unravel_index(flat, (ga, gb))
        return alphas[rows, i], betas[rows, j], coef[rows, i, j]

    lo, hi = ALPHA_RANGE
    grid = np.broadcast_to(np.geomspace(lo, hi, 20), (len(y), 20))
    a, b, coef = best(grid, grid)
    step = math.log(grid[0, 1] / grid[0, 0])
    for _ in range(3):
        local = np.exp(np.linspace(-step, step, 7))
        a, b, coef = best(np.clip(a[:, None] * local, lo, hi), np.clip(b[:, None] * local, lo, hi))
        step /= 3
    return a, b, coef


def _trend(x_n: np.ndarray, x_r: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row of y (R, m): intercept, slope per decade of N and per decade of D/N of y over log10 N and
    log10 D/N (centred), (R, 3); a slope whose axis has one value only is nan."""
    cols, where = [np.ones_like(x_n)], [0]
    for i, x in ((1, x_n), (2, x_r)):
        if np.ptp(x) > 1e-9:
            cols.append(x)
            where.append(i)
    out = np.full((len(y), 3), math.nan)
    if len(x_n) < len(cols):  # fewer cells than coefficients
        return out
    out[:, where] = y @ np.linalg.pinv(np.stack(cols, 1)).T
    return out


@dataclass
class Estimate:
    """One replicate's (or the point fit's) numbers; the law's only where it was identified."""

    law: dict[str, float] | None  # A, alpha, B, beta, E (A and B in raw units: N and D, not centred)
    c: dict[str, float]  # per arm, the effective-parameter multiplier
    trend_pct: dict[str, tuple[float, float, float]]  # per arm: intercept, per decade of N, per decade of D/N
    trend_nats: dict[str, tuple[float, float, float]]


def _estimates(cells: list[Cell], arms: list[str], base: np.ndarray, gaps: dict, centre: tuple) -> list[Estimate]:
    """The fits of R sets of cell numbers at once: base (R, m) the baseline's mean loss per cell, gaps[arm]
    = (cell indices, nats (R, m_a), % (R, m_a))."""
    ln = np.log(np.array([c.n for c in cells]))
    ld = np.log(np.array([c.d for c in cells]))
    r = len(base)
    law = None
    if len({(c.n, c.d) for c in cells}) >= len(LAW_PARAMS) + 1:
        alpha, beta, coef = _law_exponents(ln - ln.mean(), ld - ld.mean(), base)  # centred: conditioning
        law = {
            "A": coef[:, 0] * np.exp(alpha * ln.mean()),
            "alpha": alpha,
            "B": coef[:, 1] * np.exp(beta * ld.mean()),
            "beta": beta,
            "E": coef[:, 2],
        }
    c, t_pct, t_nats = {}, {}, {}
    for arm, (idx, nats, pct) in gaps.items():
        if law is not None:
            x = law["A"][:, None] * np.exp(-law["alpha"][:, None] * ln[idx])
            k = (nats * x).sum(1) / (x * x).sum(1)  # c^-alpha - 1
            with np.errstate(invalid="ignore"):
                c[arm] = np.where(k > -1.0, np.abs(1.0 + k) ** (-1.0 / law["alpha"]), math.nan)
        x_n = ln[idx] / math.log(10) - centre[0]
        x_r = (ld[idx] - ln[idx]) / math.log(10) - centre[1]
        t_pct[arm], t_nats[arm] = _trend(x_n, x_r, pct), _trend(x_n, x_r, nats)
    return [
        Estimate(
            None if law is None else {k: float(v[i]) for k, v in law.items()},
            {arm: float(v[i]) for arm, v in c.items()},
            {arm: tuple(map(float, v[i])) for arm, v in t_pct.items()},
            {arm: tuple(map(float, v[i])) for arm, v in t_nats.items()},
        )
        for i in range(r)
    ]


def _inflated_means(values: np.ndarray, draws: np.ndarray | None) -> np.ndarray:
    """The mean of `values` (k seeds, nan where one is missing) per row of `draws` (R, k: indices with
    replacement), each drawn deviation from the mean scaled by sqrt(n/(n-1)) (module doc); draws None: the
    plain mean, (1,)."""
    ok = ~np.isnan(values)
    n = int(ok.sum())
    centre = values[ok].mean()
    if draws is None:
        return np.array([centre])
    dev = values[draws] - centre
    with warnings.catch_warnings():  # a draw of none of the seeds this arm ran: no deviation, the mean itself
        warnings.simplefilter("ignore", RuntimeWarning)
        drawn = np.nanmean(dev, axis=1)
    return centre + math.sqrt(n / (n - 1)) * np.nan_to_num(drawn)


def _cell_numbers(cells: list[Cell], baseline: str, arms: list[str], draws: list | None):
    """(base (R, m), gaps) of `_estimates` from the cells' seeds, over the draws (per cell (R, k) indices into
    its baseline's seeds, the same for every arm: paired) or the seeds themselves (draws None, R = 1). An
    arm's gap in a cell needs >= 2 seeds paired with the baseline; seeds it lacks leave its draws."""
    base, gaps = [], {}
    for i, cell in enumerate(cells):
        seeds = sorted(cell.losses[baseline])
        b = np.array([cell.losses[baseline][s] for s in seeds])
        draw = None if draws is None else draws[i]
        base.append(_inflated_means(b, draw))
        for arm in arms:
            own = cell.losses.get(arm, {})
            if sum(s in own for s in seeds) < 2:
                continue
            nats = np.array([own[s] - b[j] if s in own else math.nan for j, s in enumerate(seeds)])
            idx, n_rows, p_rows = gaps.setdefault(arm, ([], [], []))
            idx.append(i)
            n_rows.append(_inflated_means(nats, draw))
            p_rows.append(_inflated_means(100.0 * nats / b, draw))
    out = {a: (np.array(i), np.stack(n, 1), np.stack(p, 1)) for a, (i, n, p) in gaps.items()}
    return np.stack(base, 1), out


@dataclass
class SweepFit:
    cells: list[Cell]
    baseline: str
    arms: list[str]
    point: Estimate
    replicates: list[Estimate]
    level: float
    centre: tuple[float, float]  # log10 N and log10 D/N the trend is centred on
    gaps: list[dict]  # per cell, {arm: (nats, %)} of the seeds' means
    means: list[float]  # per cell, the baseline's mean loss

    def _interval(self, values) -> tuple[float, float]:
        v = np.array([x for x in values if x is not None and math.isfinite(x)])
        if len(v) < max(10, 0.5 * len(self.replicates)):
            return math.nan, math.nan
        tail = 100 * (1 - self.level) / 2
        return float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))

    def law_interval(self, name: str) -> tuple[float, float]:
        return self._interval([r.law[name] if r.law else None for r in self.replicates])

    def c_interval(self, arm: str) -> tuple[float, float]:
        return self._interval([r.c.get(arm) for r in self.replicates])

    def slope(self, arm: str, axis: str, unit: str = "%") -> tuple[float, float, float]:
        """(point, lo, hi) of the gap's slope per decade of N (axis "n") or of D/N ("r")."""
        i = 1 if axis == "n" else 2
        pick = (lambda e: e.trend_pct) if unit == "%" else (lambda e: e.trend_nats)
        point = pick(self.point).get(arm, (math.nan,) * 3)[i]
        lo, hi = self._interval([pick(r).get(arm, (math.nan,) * 3)[i] for r in self.replicates])
        return point, lo, hi

    def edge(self) -> list[str]:
        """The law's exponents that sit at an end of the searched range (not identified by these cells)."""
        if not self.point.law:
            return []
        lo, hi = ALPHA_RANGE
        return [k for k in ("alpha", "beta") if not lo * 1.001 < self.point.law[k] < hi / 1.001]

    # ------------------------------------------------------------------------------- predictions
    @staticmethod
    def _law_gap(e: Estimate, arm: str, n: np.ndarray, d: np.ndarray):
        """(gap in nats, gap in %) of the law at (n, d), nan where this estimate has none."""
        if not e.law or arm not in e.c or not math.isfinite(e.c[arm]):
            return np.full_like(n, math.nan), np.full_like(n, math.nan)
        law = e.law
        term = law["A"] * n ** -law["alpha"]
        bf16 = term + law["B"] * d ** -law["beta"] + law["E"]
        nats = term * (e.c[arm] ** -law["alpha"] - 1.0)
        return nats, 100.0 * nats / bf16

    def _trend_gap(self, e: Estimate, arm: str, n: np.ndarray, d: np.ndarray, unit: str):
        t = (e.trend_pct if unit == "%" else e.trend_nats).get(arm)
        if t is None:
            return np.full_like(n, math.nan)
        x_n, x_r = np.log10(n) - self.centre[0], np.log10(d / n) - self.centre[1]
        # an axis the cells measured at one value has no slope: the trend holds at that value only (there,
        # x is 0), and is not identified off it rather than flat
        off = np.zeros(np.shape(x_n), bool)
        for slope, x in ((t[1], x_n), (t[2], x_r)):
            if not math.isfinite(slope):
                off |= ~np.isclose(x, 0.0, atol=1e-9)
        gap = t[0] + np.nan_to_num(t[1]) * x_n + np.nan_to_num(t[2]) * x_r
        return np.where(off, math.nan, gap)

    def curve(self, arm: str, n, d, model: str = "law", unit: str = "%"):
        """(point, lo, hi) arrays of the gap at (n, d) from the law or the trend."""
        n, d = np.atleast_1d(np.asarray(n, float)), np.atleast_1d(np.asarray(d, float))
        n, d = np.broadcast_arrays(n, d)

        def at(e):
            if model == "law":
                return self._law_gap(e, arm, n, d)[0 if unit == "nats" else 1]
            return self._trend_gap(e, arm, n, d, unit)

        point = at(self.point)
        reps = np.array([at(r) for r in self.replicates])
        lo, hi = np.full_like(point, math.nan), np.full_like(point, math.nan)
        for j in range(point.size):
            lo.flat[j], hi.flat[j] = self._interval(reps[:, j].tolist())
        return point, lo, hi

    def distance(self, n: float, d: float) -> tuple[float, float]:
        """Decades of N and of D/N by which (n, d) lies outside the measured cells (0 inside)."""
        ns = [c.n for c in self.cells]
        rs = [c.tokens_per_param for c in self.cells]

        def out(x, values):
            return max(0.0, math.log10(x / max(values)), math.log10(min(values) / x))

        return out(n, ns), out(d / n, rs)

    def residuals(self, arm: str) -> list[tuple[Cell, float, float]]:
        """Per cell: (cell, measured gap %, measured - the law's gap %)."""
        out = []
        for cell, gap in zip(self.cells, self.gaps):
            if arm in gap:
                fitted = self._law_gap(self.point, arm, np.array([cell.n]), np.array([cell.d]))[1][0]
                out.append((cell, gap[arm][1], gap[arm][1] - fitted))
        return out


def fit_sweep(
    cells: list[Cell],
    baseline: str,
    arms: list[str],
    bootstrap: int = BOOTSTRAP,
    level: float = LEVEL,
    seed: int = 0,
) -> SweepFit:
    """The law and the trend of `arms` against `baseline` over the cells that have >= 2 baseline seeds,
    with `bootstrap` paired replicates over seeds (module doc)."""
    cells = [c for c in cells if len(c.losses.get(baseline, {})) >= 2]
    if not cells:
        raise ValueError(f"no cell has two or more seeds of {baseline}")
    ns, rs = [math.log10(c.n) for c in cells], [math.log10(c.tokens_per_param) for c in cells]
    centre = ((min(ns) + max(ns)) / 2, (min(rs) + max(rs)) / 2)
    base, gaps = _cell_numbers(cells, baseline, arms, None)
    point = _estimates(cells, arms, base, gaps, centre)[0]
    per_cell = [
        {a: (float(n[0, list(i).index(k)]), float(p[0, list(i).index(k)])) for a, (i, n, p) in gaps.items() if k in i}
        for k in range(len(cells))
    ]
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(c.losses[baseline]), (bootstrap, len(c.losses[baseline]))) for c in cells]
    replicates = _estimates(cells, arms, *_cell_numbers(cells, baseline, arms, draws), centre) if bootstrap else []
    return SweepFit(cells, baseline, arms, point, replicates, level, centre, per_cell, [float(x) for x in base[0]])


# ------------------------------------------------------------------------------------ from the runs
def sweep_cells(exp, runs: dict, evaluation: str = "bf16") -> tuple[list[Cell], str]:
    """The cells of a sweep experiment from the report's finished runs: per run the final checkpoint's
    held-out loss (eval.json), else the last in-training validation, in BF16 (evaluation "bf16") or in the
    arm's training precision ("training"; the baseline stays in BF16). Returns the cells and a few words
    on what was measured."""
    from nvfp4train.reproduce.claims import Precision
    from nvfp4train.reproduce.plan import model_params
    from nvfp4train.reproduce.report import arm_runs, final_eval, held_curve

    precision = Precision.BF16 if evaluation == "bf16" else Precision.TRAINING
    sources: set[str] = set()
    params: dict[str, float] = {}
    cells: dict[tuple[str, float], Cell] = {}
    for name, arm in exp.arms.items():
        if arm.cell is None:
            continue
        size, tpp, template = arm.cell
        use = Precision.BF16 if template == exp.baseline else precision
        for seed, run in arm_runs(runs, exp, name).items():  # a borrowed cell's: its lender's
            loss = final_eval(run, use)
            if loss is not None:
                sources.add("final checkpoint's held-out loss (eval.json)")
            else:
                curve = held_curve(run, use)
                if not curve:
                    continue
                loss = curve[max(curve)]
                sources.add("last in-training validation")
            key = repr(run.config["model"])
            if key not in params:
                params[key] = float(model_params(run.config["model"])[1])
            cell = cells.setdefault((size, tpp), Cell(size, params[key], run.total, {}, tpp))
            cell.losses.setdefault(template, {})[seed] = loss
    return sorted(cells.values(), key=lambda c: (c.n, c.d)), " and ".join(sorted(sources)) or "nothing"


# ------------------------------------------------------------------------------------------ numbers
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float | None:
    """12e9, 1.2e10, 12B, 350M, 10T (K, M, B or G, T), 1_000_000: the number, None if it is not one."""
    m = re.fullmatch(r"\s*([0-9][0-9_]*\.?[0-9]*(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if not m:
        return None
    value = float(m.group(1).replace("_", "")) * _SUFFIX.get(m.group(2), 1.0)
    return value if value > 0 and math.isfinite(value) else None


def count_text(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def interval_text(point: float, lo: float, hi: float, unit: str = "%", digits: int = 2) -> str:
    if not math.isfinite(point):
        return "not identified"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{point:+.{digits}f}{unit} (no interval)"
    return f"{point:+.{digits}f}{unit} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


@dataclass
class Prediction:
    arm: str
    n: float
    d: float
    law_pct: tuple[float, float, float]
    law_nats: tuple[float, float, float]
    trend_pct: tuple[float, float, float]
    decades: tuple[float, float]  # outside the measured cells, in N and in D/N


def predict(fit: SweepFit, arm: str, n: float, d: float) -> Prediction:
    def one(model, unit):
        p, lo, hi = fit.curve(arm, n, d, model, unit)
        return float(p[0]), float(lo[0]), float(hi[0])

    return Prediction(arm, n, d, one("law", "%"), one("law", "nats"), one("trend", "%"), fit.distance(n, d))
