"""Paired statistics of the reproduction: pure functions of numbers (no files, no plotting).

Runs are paired by seed: a seed gives every arm the same initial weights and the same batches, so the
difference between two arms of one seed is free of the seed-to-seed variation. The primary statistic of a
comparison is the paired relative gap (arm - baseline) / baseline of one seed, averaged over a window of
the training tokens (the stable phase, 20-80%, or the decay, 80-100%); over seeds its mean gets a 95%
confidence interval from Student's t distribution, and the verdict comes from that interval.

scipy is not needed: the t distribution's CDF is the regularized incomplete beta function (a continued
fraction, as in Numerical Recipes §6.4), and its quantile is found by bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

STABLE = (0.2, 0.8)
DECAY = (0.8, 1.0)
ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000  # beyond this a seed count is reported as "more than"

REPRODUCED, DIRECTION_ONLY, CONTRADICTED, UNRESOLVED = "reproduced", "direction only", "contradicted", "unresolved"


# --------------------------------------------------------------------------- Student's t
def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    if df <= 0:
        raise ValueError(f"t_cdf: df={df} must be > 0")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p={p} must lie in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Interval:
    """Mean of n paired values with its 95% interval (None for one value) and their SD."""

    n: int
    mean: float
    sd: float | None
    lo: float | None
    hi: float | None

    def text(self, unit: str = "%", digits: int = 2) -> str:
        if self.lo is None:
            return f"{self.mean:+.{digits}f}{unit} (1 seed, no interval)"
        return (
            f"{self.mean:+.{digits}f}{unit} [{self.lo:+.{digits}f}, {self.hi:+.{digits}f}] "
            f"(n={self.n}, SD {self.sd:.{digits}f})"
        )


def mean_interval(values: list[float], alpha: float = ALPHA) -> Interval:
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval: no values")
    mean = sum(values) / n
    if n == 1:
        return Interval(1, mean, None, None, None)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def seeds_needed(
    effect: float, sd: float, alpha: float = ALPHA, power: float = POWER, max_n: int = 1000, sides: int = 2
) -> int | None:
    """Seeds for a paired t-test at `alpha` (two-sided, or one-sided with sides=1) to detect `effect` with
    `power`, at the observed SD: the smallest n with ((t_{1-alpha/sides,n-1} + t_{power,n-1}) * sd /
    effect)^2 <= n. None: more than max_n (or no effect to detect)."""
    if effect == 0 or not math.isfinite(effect):
        return None
    if sd <= 0:
        return 2

    def enough(n: int) -> bool:
        return ((t_quantile(1 - alpha / sides, n - 1) + t_quantile(power, n - 1)) * sd / abs(effect)) ** 2 <= n

    # the left side falls with n (the quantiles shrink) and the right one grows: a bisection finds the first n
    if not enough(max_n):
        return None
    lo, hi = 1, max_n  # enough(hi), and not enough(lo) (n = 1 has no t distribution)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


# --------------------------------------------------------------------------- paired gaps
def relative_gaps(arm: dict[float, float], base: dict[float, float]) -> dict[float, float]:
    """(arm - base) / base in %, at the tokens both curves have."""
    return {t: (arm[t] - base[t]) / base[t] * 100.0 for t in sorted(set(arm) & set(base)) if base[t]}


def window_mean(curve: dict[float, float], total: float, window: tuple[float, float]) -> float | None:
    """Mean of a {tokens: value} curve over the points with lo * total < tokens <= hi * total (a window
    starting at 0 includes 0); None where none fall inside."""
    lo, hi = window
    inside = [v for t, v in curve.items() if (lo * total < t or (lo == 0 and t == 0)) and t <= hi * total]
    return sum(inside) / len(inside) if inside else None


def paired_window_gap(
    arm: dict[int, dict[float, float]], base: dict[int, dict[float, float]], total: float, window: tuple[float, float]
) -> tuple[Interval | None, dict[int, float]]:
    """Per seed present in both: the mean relative gap over the window; then their interval."""
    per_seed = {}
    for seed in sorted(set(arm) & set(base)):
        value = window_mean(relative_gaps(arm[seed], base[seed]), total, window)
        if value is not None:
            per_seed[seed] = value
    return (mean_interval(list(per_seed.values())) if per_seed else None), per_seed


def paired_end_gap(arm: dict[int, float], base: dict[int, float]) -> tuple[Interval | None, dict[int, float]]:
    """Per seed present in both: (arm - base) / base in % of one value per run (its end of run)."""
    per_seed = {s: (arm[s] - base[s]) / base[s] * 100.0 for s in sorted(set(arm) & set(base)) if base[s]}
    return (mean_interval(list(per_seed.values())) if per_seed else None), per_seed


# --------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Claim:
    """What the paper says a gap (in %, positive = the arm's loss is higher) is: `side` "worse" (> 0),
    "better" (< 0), "below" (between 0 and `bound`: e.g. < 1%), or "equal" (within +-`bound` of 0)."""

    side: str
    bound: float | None = None

    def __post_init__(self):
        if self.side not in ("worse", "better", "below", "equal"):
            raise ValueError(f"Claim.side={self.side!r}: allowed worse, better, below, equal")
        if self.side in ("below", "equal") and (self.bound is None or self.bound <= 0):
            raise ValueError(f"Claim({self.side}): needs a bound > 0")


@dataclass(frozen=True)
class Verdict:
    verdict: str  # reproduced | direction only | contradicted | unresolved
    reason: str
    seeds_needed: int | None = None
    p: float | None = None  # the p-value of the rejection the verdict rests on (None: it rests on none)
    p_adjusted: float | None = None  # p after Holm's correction over its family (None: not in one)

    def text(self) -> str:
        more = ""
        if self.verdict == UNRESOLVED and self.seeds_needed is not None:
            if self.seeds_needed > MAX_SEEDS:
                more = f"; more than {MAX_SEEDS} seeds would be needed at the observed SD"
            else:
                more = f"; ~{self.seeds_needed} seeds would resolve it at the observed SD"
        return f"{self.verdict} ({self.reason}{more})"


def seeds_to_resolve(distance: float, sd: float | None) -> int | None:
    """`seeds_needed` for the interval to clear a point (0 or the claim's bound) `distance` away from the
    mean; MAX_SEEDS + 1 where more than MAX_SEEDS would be needed (the mean sits on that point)."""
    if sd is None:
        return None
    n = seeds_needed(distance, sd, max_n=MAX_SEEDS)
    return n if n is not None else MAX_SEEDS + 1


def verdict(interval: Interval | None, claim: Claim) -> Verdict:
    """The verdict of a paired interval against the paper's claim."""
    if interval is None:
        return Verdict(UNRESOLVED, "no paired runs")
    if interval.lo is None:
        return Verdict(UNRESOLVED, "one seed: no interval")
    lo, hi, mean, sd = interval.lo, interval.hi, interval.mean, interval.sd
    need = seeds_to_resolve(mean, sd)
    if claim.side in ("worse", "better"):
        sign = 1 if claim.side == "worse" else -1
        if sign * lo > 0 and sign * hi > 0:
            return Verdict(REPRODUCED, f"the interval lies {'above' if sign > 0 else 'below'} 0")
        if sign * lo < 0 and sign * hi < 0:
            return Verdict(CONTRADICTED, f"the interval lies {'below' if sign > 0 else 'above'} 0")
        return Verdict(UNRESOLVED, "the interval contains 0", need)
    bound = claim.bound
    if claim.side == "below":
        if lo > 0 and hi < bound:
            return Verdict(REPRODUCED, f"the interval lies between 0 and {bound:g}%")
        if hi < 0 or lo > bound:
            return Verdict(CONTRADICTED, f"the interval lies {'below 0' if hi < 0 else f'above {bound:g}%'}")
        if lo <= 0:
            return Verdict(UNRESOLVED, "the interval crosses 0", need)
        return Verdict(UNRESOLVED, f"the interval crosses {bound:g}%", seeds_to_resolve(mean - bound, sd))
    # equal: within +-bound
    if -bound < lo and hi < bound:
        return Verdict(REPRODUCED, f"the interval lies within ±{bound:g}%")
    if lo > bound or hi < -bound:
        return Verdict(CONTRADICTED, f"the interval lies outside ±{bound:g}%")
    return Verdict(UNRESOLVED, f"the interval crosses ±{bound:g}%", seeds_to_resolve(bound - abs(mean), sd))


# --------------------------------------------------------------------------- tests of the claims' kinds
# Each test takes the per-seed paired values (in %, positive = the arm's loss is higher) and returns a
# Verdict whose `p` is that of the rejection its verdict rests on: `holm` adjusts those p-values over a
# family and turns a verdict whose adjusted p is not below ALPHA into "unresolved".
def _moments(values: list[float]) -> tuple[int, float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return n, mean, sd


def p_value(values: list[float], null: float = 0.0, side: str = "two") -> float:
    """Paired t-test of mean(values) against `null`: side "two", "greater" (H1: mean > null) or "less"."""
    n, mean, sd = _moments(values)
    if n < 2:
        raise ValueError("p_value: needs 2 values or more")
    if sd == 0:
        t = math.copysign(math.inf, mean - null) if mean != null else 0.0
    else:
        t = (mean - null) / (sd / math.sqrt(n))
    if math.isinf(t):
        upper = 0.0 if t > 0 else 1.0
    else:
        upper = 1.0 - t_cdf(t, n - 1)  # P(T > t)
    if side == "greater":
        return upper
    if side == "less":
        return 1.0 - upper
    return min(1.0, 2.0 * min(upper, 1.0 - upper))


def one_sided_bound(values: list[float], side: str, alpha: float = ALPHA) -> float:
    """The one-sided (1 - alpha) bound of the mean: side "upper" or "lower"."""
    n, mean, sd = _moments(values)
    half = t_quantile(1 - alpha, n - 1) * sd / math.sqrt(n)
    return mean + half if side == "upper" else mean - half


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER, sides: int = 2) -> float:
    """The smallest true mean a paired t-test of n seeds at `alpha` detects with `power`, at SD `sd`."""
    return (t_quantile(1 - alpha / sides, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def _few(values: list[float]) -> Verdict | None:
    if not values:
        return Verdict(UNRESOLVED, "no paired runs")
    if len(values) < 2:
        return Verdict(UNRESOLVED, "one seed: no interval")
    return None


def _need(effect: float, sd: float, sides: int = 2) -> int:
    n = seeds_needed(effect, sd, max_n=MAX_SEEDS, sides=sides)
    return n if n is not None else MAX_SEEDS + 1


def judge_bound(values: list[float], bound: float) -> Verdict:
    """ "Below `bound`" (e.g. < 1%): one-sided. Reproduced where the one-sided 95% upper bound is below it,
    contradicted where the one-sided 95% lower bound is above it."""
    few = _few(values)
    if few:
        return few
    n, mean, sd = _moments(values)
    upper, lower = one_sided_bound(values, "upper"), one_sided_bound(values, "lower")
    if upper < bound:
        return Verdict(
            REPRODUCED, f"one-sided 95% upper bound {upper:+.2f}% < {bound:g}%", p=p_value(values, bound, "less")
        )
    if lower > bound:
        return Verdict(
            CONTRADICTED,
            f"one-sided 95% lower bound {lower:+.2f}% > {bound:g}%",
            p=p_value(values, bound, "greater"),
        )
    return Verdict(
        UNRESOLVED, f"one-sided 95% upper bound {upper:+.2f}% crosses {bound:g}%", _need(bound - mean, sd, sides=1)
    )


def judge_size(values: list[float], value: float) -> Verdict:
    """ "≈ value": reproduced where the sign is the paper's (the 95% interval excludes 0 on its side) and
    `value` lies inside the interval; direction only where the sign is right and `value` lies outside;
    contradicted where the interval lies on the other side of 0."""
    few = _few(values)
    if few:
        return few
    interval = mean_interval(values)
    _, mean, sd = _moments(values)
    sign = 1 if value > 0 else -1
    p = p_value(values)
    if sign * interval.lo > 0:
        if interval.lo <= value <= interval.hi:
            return Verdict(REPRODUCED, f"sign right, the paper's {value:+g}% inside the 95% interval", p=p)
        where = "above" if value > interval.hi else "below"
        return Verdict(DIRECTION_ONLY, f"sign right, the paper's {value:+g}% {where} the 95% interval", p=p)
    if sign * interval.hi < 0:
        return Verdict(CONTRADICTED, "the 95% interval lies on the other side of 0", p=p)
    return Verdict(UNRESOLVED, "the 95% interval contains 0", _need(value, sd))


def judge_direction(values: list[float], side: str, effect: float | None = None) -> Verdict:
    """ "Worse" (> 0) or "better" (< 0): the 95% interval on that side of 0 (reproduced) or on the other
    (contradicted). Unresolved: the seeds for power 0.8 at the paper's `effect` (the observed mean where
    the paper gives none)."""
    few = _few(values)
    if few:
        return few
    interval = mean_interval(values)
    _, mean, sd = _moments(values)
    sign = 1 if side == "worse" else -1
    p = p_value(values)
    if sign * interval.lo > 0 and sign * interval.hi > 0:
        return Verdict(REPRODUCED, f"the 95% interval lies {'above' if sign > 0 else 'below'} 0", p=p)
    if sign * interval.lo < 0 and sign * interval.hi < 0:
        return Verdict(CONTRADICTED, f"the 95% interval lies {'below' if sign > 0 else 'above'} 0", p=p)
    at = "the paper's effect" if effect is not None else "the observed mean"
    return Verdict(UNRESOLVED, f"the 95% interval contains 0 (power at {at})", _need(effect if effect else mean, sd))


def judge_equivalence(values: list[float], margin: float) -> Verdict:
    """ "No measurable difference": two one-sided tests against ±margin (reproduced: both reject at ALPHA,
    i.e. the 90% interval lies within ±margin); contradicted where the 95% interval lies outside ±margin.
    The reason gives the minimum detectable effect (power 0.8) beside the margin."""
    few = _few(values)
    if few:
        return few
    n, mean, sd = _moments(values)
    interval = mean_interval(values)
    mde = min_detectable_effect(sd, n)
    beside = f"margin ±{margin:g}%, minimum detectable effect {mde:.2f}%"
    p_tost = max(p_value(values, -margin, "greater"), p_value(values, margin, "less"))
    if p_tost < ALPHA:
        return Verdict(REPRODUCED, f"equivalent within ±{margin:g}% (TOST p = {p_tost:.3g}; {beside})", p=p_tost)
    if interval.lo > margin or interval.hi < -margin:
        p = p_value(values, margin if mean > 0 else -margin)
        return Verdict(CONTRADICTED, f"the 95% interval lies outside ±{margin:g}% ({beside})", p=p)
    return Verdict(UNRESOLVED, f"TOST p = {p_tost:.3g} ({beside})", _need(max(margin - abs(mean), 1e-12), sd, sides=1))


@dataclass(frozen=True)
class Ratio:
    """mean(a) / mean(b) of paired per-seed values, with its Fieller 95% interval (lo, hi None: the
    interval is unbounded because mean(b) does not differ from 0 at the observed spread)."""

    n: int
    value: float
    lo: float | None
    hi: float | None

    def text(self, digits: int = 2) -> str:
        if self.lo is None:
            return f"{self.value:.{digits}f} (unbounded interval, n={self.n})"
        return f"{self.value:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}] (n={self.n})"


def fieller(a: list[float], b: list[float], alpha: float = ALPHA) -> Ratio:
    """Fieller's interval of mean(a) / mean(b) for paired samples: every r for which the paired t-test of
    a - r * b does not reject at `alpha` (two-sided)."""
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    saa = sum((x - ma) ** 2 for x in a) / (n - 1)
    sbb = sum((y - mb) ** 2 for y in b) / (n - 1)
    sab = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    t2 = t_quantile(1 - alpha / 2, n - 1) ** 2 / n
    qa, qb, qc = mb * mb - t2 * sbb, ma * mb - t2 * sab, ma * ma - t2 * saa
    value = ma / mb if mb else math.inf
    disc = qb * qb - qa * qc
    if -1e-12 * abs(qa * qc) <= disc < 0:  # a = r * b in every pair: disc is 0, up to rounding; the interval is r
        disc = 0.0
    if qa <= 0 or disc < 0:
        return Ratio(n, value, None, None)
    root = math.sqrt(disc)
    return Ratio(n, value, (qb - root) / qa, (qb + root) / qa)


def judge_fraction(recovered: list[float], gap: list[float], fraction: float) -> tuple[Verdict, Ratio | None]:
    """The fraction of a gap (per seed, e.g. NVFP4 - FP8) that a change recovers (per seed, NVFP4 - switch),
    against the paper's `fraction`: reproduced where the Fieller 95% interval excludes 0 and holds it,
    contradicted where it lies below it, direction only where it lies above (more recovered than the
    paper's), unresolved where it contains 0 or is unbounded (the gap itself is not resolved)."""
    few = _few(recovered)
    if few:
        return few, None
    ratio = fieller(recovered, gap)
    n, mean_gap, sd_gap = _moments(gap)
    if ratio.lo is None:
        return Verdict(
            UNRESOLVED, "the gap to recover is not resolved: unbounded interval", _need(mean_gap, sd_gap)
        ), ratio
    against = [x - fraction * y for x, y in zip(recovered, gap)]
    _, _, sd_against = _moments(against)
    if ratio.hi < fraction:
        return Verdict(
            CONTRADICTED, f"the 95% interval lies below the paper's {fraction:.2f}", p=p_value(against)
        ), ratio
    if ratio.lo <= 0:
        return Verdict(UNRESOLVED, "the 95% interval contains 0", _need(fraction * mean_gap, sd_against)), ratio
    if ratio.lo > fraction:
        return Verdict(
            DIRECTION_ONLY, f"recovers more: the 95% interval lies above the paper's {fraction:.2f}", p=p_value(against)
        ), ratio
    return Verdict(REPRODUCED, f"the paper's {fraction:.2f} lies inside the 95% interval", p=p_value(recovered)), ratio


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def apply_holm(verdicts: list[Verdict], alpha: float = ALPHA) -> list[Verdict]:
    """Holm's correction over a family: each verdict that rests on a p-value gets its adjusted p, and one
    whose adjusted p is not below `alpha` becomes unresolved (its reason says why)."""
    tested = [i for i, v in enumerate(verdicts) if v.p is not None]
    adjusted = holm([verdicts[i].p for i in tested])
    out = list(verdicts)
    for i, q in zip(tested, adjusted):
        v = replace(verdicts[i], p_adjusted=q)
        if v.verdict != UNRESOLVED and q >= alpha:
            v = replace(v, verdict=UNRESOLVED, reason=f"{v.reason}, but Holm-adjusted p = {q:.3g} ≥ {alpha:g}")
        out[i] = v
    return out


# --------------------------------------------------------------------------- token equivalent (budgets)
def budget_to_reach(final_losses: dict[float, float], target: float) -> float | None:
    """The token budget (a multiple k of the base budget) at which runs trained with their own schedule at
    k x the tokens reach `target` final loss: final loss interpolated linearly between the budgets
    (sorted by k). None: no budget reaches it, or the smallest one is already below it."""
    points = sorted(final_losses.items())
    if not points or points[0][1] <= target:
        return points[0][0] if points and points[0][1] == target else None
    for (k0, l0), (k1, l1) in zip(points, points[1:]):
        if l1 <= target:
            return k0 + (k1 - k0) * (l0 - target) / (l0 - l1)
    return None
