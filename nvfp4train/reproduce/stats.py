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
from dataclasses import dataclass

STABLE = (0.2, 0.8)
DECAY = (0.8, 1.0)
ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000  # beyond this a seed count is reported as "more than"

REPRODUCED, CONTRADICTED, UNRESOLVED = "reproduced", "contradicted", "unresolved"


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


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = POWER, max_n: int = 1000) -> int | None:
    """Seeds for a two-sided paired t-test at `alpha` to detect `effect` with `power`, at the observed SD:
    the smallest n with ((t_{1-alpha/2,n-1} + t_{power,n-1}) * sd / effect)^2 <= n. None: more than max_n
    (or no effect to detect)."""
    if effect == 0 or not math.isfinite(effect):
        return None
    if sd <= 0:
        return 2

    def enough(n: int) -> bool:
        return ((t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / abs(effect)) ** 2 <= n

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
    verdict: str  # reproduced | contradicted | unresolved
    reason: str
    seeds_needed: int | None = None

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


# --------------------------------------------------------------------------- token equivalent
def tokens_to_reach(curve: dict[float, float], target: float) -> float | None:
    """The first token count at which a loss-vs-tokens curve reaches `target`, linearly interpolated
    between logged points; None if it never does."""
    points = sorted(curve.items())
    for (t0, l0), (t1, l1) in zip(points, points[1:]):
        if l0 <= target:
            return t0
        if l1 <= target:
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    if points and points[-1][1] <= target:
        return points[-1][0]
    return None


def token_ratio(
    arm_curve: dict[float, float], arm_tokens: float, base_curve: dict[float, float], base_tokens: float
) -> float | None:
    """The arm's tokens / the baseline's tokens for the same loss, that of the run that ends worse (the
    better run reaches it within its budget): > 1, the arm is less token-efficient. A worse arm: its
    tokens / those the baseline needs to reach the arm's final loss; a better arm: the tokens it needs to
    reach the baseline's final loss / the baseline's. Both cases count, so every seed counts: keeping only
    seeds where the arm ends worse would bias the mean above 1x. None: the better run starts at or below
    that loss (a point at 0 tokens), so there is no ratio."""
    arm_final, base_final = arm_curve[max(arm_curve)], base_curve[max(base_curve)]
    if arm_final >= base_final:
        reached = tokens_to_reach(base_curve, arm_final)
        return arm_tokens / reached if reached else None
    reached = tokens_to_reach(arm_curve, base_final)
    return reached / base_tokens if reached else None
