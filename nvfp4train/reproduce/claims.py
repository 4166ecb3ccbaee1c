"""The paper's claims that the report tests, read from configs/reproduce/claims/paper.yaml: each names its
arms, its kind (which decides its test, stats.judge_*) and its primary endpoint (which loss, which window or
point, which evaluation precision), fixed before the runs. docs: ../shared/docs/nvfp4-recipe.md §4.

File keys (one mapping per claim under `claims:`):

    id: NAME                  unique
    paper: TEXT               the paper's words, with its figure
    arm: ARM, baseline: ARM   the gap is (arm - baseline) / baseline in %, positive = the arm is worse
    primary: true | false     primary claims form the summary's family (Holm); the others are exploratory
    kind: bound | size | direction | equivalence | fraction_recovered | token_equivalent
      bound: B                bound: the gap is below B (%), one-sided
      value: V                size: the gap is about V (%)
      side: worse | better    direction; effect: E (%, optional) the paper's effect, for the seeds needed
      margin: M               equivalence: |gap| < M (%), TOST; rules_out: {effect: E, what: TEXT}, the
                              effect the claim must tell apart from none (M must be below E)
      fraction: F             fraction_recovered: (baseline - arm) / (baseline - reference) of the gap;
      reference: ARM          the arm whose gap to the baseline is recovered (e.g. FP8)
      ratio: R                token_equivalent: the arm needs R x the baseline's tokens for its loss;
      arm_budgets: {K: ARM}   runs of the arm trained at K x the tokens (own schedule), K = 1.0 included;
      baseline_budgets: {K: ARM}  the same for the baseline (used where the arm ends better)
    endpoint:
      loss: training | validation | final_eval
      precision: training | bf16           of a held-out loss (the training loss is in training precision)
      window: [LO, HI]  | at: final | change: [LO, HI]   fractions of the tokens: a window's mean, the last
                        point, or the gap at HI minus the gap at LO (validation); final_eval has none
      after_repeat: {ENDPOINT}  training loss only: the held-out endpoint used where the window lies past the
                        first repeat of any data source (a training-loss window always ends there)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from nvfp4train.reproduce.experiments import EXPERIMENTS_DIR, UsageError

CLAIMS_FILE = EXPERIMENTS_DIR / "claims" / "paper.yaml"


class Kind(Enum):
    BOUND = "bound"
    SIZE = "size"
    DIRECTION = "direction"
    EQUIVALENCE = "equivalence"
    FRACTION_RECOVERED = "fraction_recovered"
    TOKEN_EQUIVALENT = "token_equivalent"


class Loss(Enum):
    TRAINING = "training"
    VALIDATION = "validation"
    FINAL_EVAL = "final_eval"


class Precision(Enum):
    TRAINING = "training"
    BF16 = "bf16"


class Point(Enum):
    WINDOW = "window"
    FINAL = "final"
    CHANGE = "change"


@dataclass(frozen=True)
class Endpoint:
    loss: Loss
    precision: Precision
    point: Point
    window: tuple[float, float] | None = None
    after_repeat: Endpoint | None = None

    def text(self) -> str:
        where = ""
        if self.window is not None:
            lo, hi = (round(100 * x) for x in self.window)
            where = f", {lo}–{hi}% of tokens" if self.point is Point.WINDOW else f", gap at {hi}% − gap at {lo}%"
        elif self.point is Point.FINAL and self.loss is Loss.VALIDATION:
            where = ", last point"
        if self.loss is Loss.TRAINING:
            after = f"; past the first repeat: {self.after_repeat.text()}" if self.after_repeat else ""
            return f"training loss{where} (ends at the first data repeat){after}"
        precision = "training precision" if self.precision is Precision.TRAINING else "BF16"
        if self.loss is Loss.VALIDATION:
            return f"in-training validation in {precision}{where}"
        return f"final checkpoint's evaluation in {precision}"


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    arm: str
    baseline: str
    kind: Kind
    endpoint: Endpoint
    primary: bool = True
    bound: float | None = None
    value: float | None = None
    side: str | None = None
    effect: float | None = None
    margin: float | None = None
    rules_out: float | None = None
    rules_out_what: str | None = None
    fraction: float | None = None
    reference: str | None = None
    ratio: float | None = None
    arm_budgets: dict[float, str] = field(default_factory=dict)
    baseline_budgets: dict[float, str] = field(default_factory=dict)

    @property
    def paper_value(self) -> str:
        """The paper's number this claim is tested against, as the summary prints it."""
        if self.kind is Kind.BOUND:
            return f"< {self.bound:g}%"
        if self.kind is Kind.SIZE:
            return f"≈ {self.value:+g}%"
        if self.kind is Kind.DIRECTION:
            return f"{self.side}" + (f" (≈ {self.effect:+g}%)" if self.effect is not None else "")
        if self.kind is Kind.EQUIVALENCE:
            return f"≈ 0 (tested within ±{self.margin:g}%)"
        if self.kind is Kind.FRACTION_RECOVERED:
            return f"{self.fraction:.2f} of the gap to {self.reference} recovered"
        return f"{self.ratio:g}x the tokens"

    @property
    def arms_needed(self) -> list[str]:
        extra = [self.reference] if self.reference else []
        return [self.arm, self.baseline, *extra, *self.arm_budgets.values(), *self.baseline_budgets.values()]


KEYS = {
    "id",
    "paper",
    "arm",
    "baseline",
    "primary",
    "kind",
    "endpoint",
    "bound",
    "value",
    "side",
    "effect",
    "margin",
    "rules_out",
    "fraction",
    "reference",
    "ratio",
    "arm_budgets",
    "baseline_budgets",
}
NEEDS = {
    Kind.BOUND: ("bound",),
    Kind.SIZE: ("value",),
    Kind.DIRECTION: ("side",),
    Kind.EQUIVALENCE: ("margin", "rules_out"),
    Kind.FRACTION_RECOVERED: ("fraction", "reference"),
    Kind.TOKEN_EQUIVALENT: ("ratio", "arm_budgets", "baseline_budgets"),
}
ENDPOINT_KEYS = ("loss", "precision", "window", "at", "change", "after_repeat")


def _enum(where: str, enum: type[Enum], value) -> Enum:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum)
        raise UsageError(f"{where}={value!r}; allowed: {allowed}") from None


def _number(where: str, value, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise UsageError(f"{where}={value!r}; expected a number" + (" > 0" if positive else ""))
    return float(value)


def _fractions(where: str, value) -> tuple[float, float]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        or not 0 <= value[0] < value[1] <= 1
    ):
        raise UsageError(f"{where}={value!r}; expected [LO, HI] with 0 <= LO < HI <= 1 (fractions of the tokens)")
    return float(value[0]), float(value[1])


def _endpoint(where: str, spec, nested: bool = False) -> Endpoint:
    if not isinstance(spec, dict):
        raise UsageError(f"{where}={spec!r}; expected a mapping of {', '.join(ENDPOINT_KEYS)}")
    unknown = sorted(set(spec) - set(ENDPOINT_KEYS))
    if unknown:
        raise UsageError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(ENDPOINT_KEYS)}")
    loss = _enum(f"{where}.loss", Loss, spec.get("loss"))
    points = [k for k in ("window", "at", "change") if k in spec]
    if len(points) > 1:
        raise UsageError(f"{where}: {' and '.join(points)}; give one of window, at, change")
    precision = _enum(f"{where}.precision", Precision, spec.get("precision", "training"))
    if loss is Loss.TRAINING and precision is not Precision.TRAINING:
        raise UsageError(f"{where}.precision={precision.value!r}: the training loss is in training precision")
    after = None
    if "after_repeat" in spec:
        if loss is not Loss.TRAINING or nested:
            raise UsageError(f"{where}.after_repeat: only a training-loss endpoint has one")
        after = _endpoint(f"{where}.after_repeat", spec["after_repeat"], nested=True)
        if after.loss is Loss.TRAINING:
            raise UsageError(f"{where}.after_repeat.loss='training': expected a held-out loss (validation, final_eval)")
    if loss is Loss.FINAL_EVAL:
        if points:
            raise UsageError(f"{where}.{points[0]}: final_eval is the final checkpoint, it takes no window or point")
        return Endpoint(loss, precision, Point.FINAL)
    if not points:
        raise UsageError(f"{where}: {loss.value} needs one of window: [LO, HI], at: final, change: [LO, HI]")
    if points[0] == "at":
        if spec["at"] != "final":
            raise UsageError(f"{where}.at={spec['at']!r}; allowed: final")
        return Endpoint(loss, precision, Point.FINAL, None, after)
    if points[0] == "change" and loss is not Loss.VALIDATION:
        raise UsageError(f"{where}.change: only for validation (a training-loss window ends at the first repeat)")
    window = _fractions(f"{where}.{points[0]}", spec[points[0]])
    return Endpoint(loss, precision, Point.WINDOW if points[0] == "window" else Point.CHANGE, window, after)


def _budgets(where: str, value) -> dict[float, str]:
    if not isinstance(value, dict) or not value or not all(isinstance(a, str) for a in value.values()):
        raise UsageError(f"{where}={value!r}; expected a mapping K: ARM (K x the tokens), with K = 1.0 among them")
    out = {_number(f"{where} key", k, positive=True): a for k, a in value.items()}
    if 1.0 not in out:
        raise UsageError(f"{where}: no K = 1.0 (the runs at the base budget)")
    return dict(sorted(out.items()))


def parse_claim(where: str, spec) -> Claim:
    if not isinstance(spec, dict):
        raise UsageError(f"{where}: expected a mapping of {', '.join(sorted(KEYS))}")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise UsageError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(sorted(KEYS))}")
    for key in ("id", "paper", "arm", "baseline", "kind", "endpoint"):
        if not spec.get(key):
            raise UsageError(f"{where}.{key}: missing")
    where = f"{where} ({spec['id']})"
    kind = _enum(f"{where}.kind", Kind, spec["kind"])
    for key in NEEDS[kind]:
        if spec.get(key) is None:
            raise UsageError(f"{where}.{key}: missing (kind {kind.value} needs {', '.join(NEEDS[kind])})")
    primary = spec.get("primary", True)
    if not isinstance(primary, bool):
        raise UsageError(f"{where}.primary={primary!r}; expected true or false")
    fields = {}
    if kind is Kind.BOUND:
        fields["bound"] = _number(f"{where}.bound", spec["bound"], positive=True)
    if kind is Kind.SIZE:
        fields["value"] = _number(f"{where}.value", spec["value"])
        if fields["value"] == 0:
            raise UsageError(f"{where}.value=0: a size claim of 0 is an equivalence claim (kind: equivalence)")
    if kind is Kind.DIRECTION:
        if spec["side"] not in ("worse", "better"):
            raise UsageError(f"{where}.side={spec['side']!r}; allowed: worse, better")
        fields["side"] = spec["side"]
        if spec.get("effect") is not None:
            fields["effect"] = _number(f"{where}.effect", spec["effect"])
    if kind is Kind.EQUIVALENCE:
        margin = _number(f"{where}.margin", spec["margin"], positive=True)
        ro = spec["rules_out"]
        if not isinstance(ro, dict) or set(ro) != {"effect", "what"} or not isinstance(ro["what"], str):
            raise UsageError(f"{where}.rules_out={ro!r}; expected {{effect: E (%), what: TEXT}}")
        effect = abs(_number(f"{where}.rules_out.effect", ro["effect"]))
        if margin >= effect:
            raise UsageError(
                f"{where}.margin={margin:g}: not below rules_out.effect={effect:g} ({ro['what']}); a margin that "
                "wide cannot tell no effect from that one"
            )
        fields.update(margin=margin, rules_out=effect, rules_out_what=ro["what"])
    if kind is Kind.FRACTION_RECOVERED:
        fields["fraction"] = _number(f"{where}.fraction", spec["fraction"], positive=True)
        fields["reference"] = str(spec["reference"])
    if kind is Kind.TOKEN_EQUIVALENT:
        fields["ratio"] = _number(f"{where}.ratio", spec["ratio"], positive=True)
        fields["arm_budgets"] = _budgets(f"{where}.arm_budgets", spec["arm_budgets"])
        fields["baseline_budgets"] = _budgets(f"{where}.baseline_budgets", spec["baseline_budgets"])
    extra = sorted(
        k for k in set(spec) - {"id", "paper", "arm", "baseline", "primary", "kind", "endpoint"} if k not in NEEDS[kind]
    )
    if extra and not (kind is Kind.DIRECTION and extra == ["effect"]):
        raise UsageError(f"{where}.{extra[0]}: not a key of kind {kind.value} (it takes {', '.join(NEEDS[kind])})")
    return Claim(
        id=str(spec["id"]),
        paper=" ".join(str(spec["paper"]).split()),
        arm=str(spec["arm"]),
        baseline=str(spec["baseline"]),
        kind=kind,
        endpoint=_endpoint(f"{where}.endpoint", spec["endpoint"]),
        primary=primary,
        **fields,
    )


def load_claims(path: Path = CLAIMS_FILE) -> tuple[Claim, ...]:
    """The claims of a claims file, validated (UsageError: one line naming the file and key)."""
    import yaml

    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: cannot read the claims file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not valid YAML ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(spec, dict) or set(spec) != {"claims"} or not isinstance(spec["claims"], list):
        raise UsageError(f"{path}: expected one key, claims: a list of claims")
    claims = tuple(parse_claim(f"{path}: claims[{i}]", c) for i, c in enumerate(spec["claims"]))
    ids = [c.id for c in claims]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup:
        raise UsageError(f"{path}: claim id {dup!r} is used twice")
    return claims
