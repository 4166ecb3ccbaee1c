"""The experiment files, configs/reproduce/<name>.yaml, and their typed schema.

An experiment is a set of arms (name -> overrides of `python -m nvfp4train.train`) trained on the same
model, data order (the seed), schedule and token budget, with the seeds each arm runs and the arm the
others are measured against. Keys:

    description: one line
    tier: A | B | earlier           the report groups experiments by tier
    include: NAME                   merge _NAME.yaml of the same directory first (its `base` comes first)
    tokens: 39321600                training tokens per run
    seeds: [1, 2, 3]                the default seeds of every arm
    baseline: fp8_blockwise         an arm, or a borrowed one
    base: [OVERRIDE, ...]           overrides shared by every arm
    arms: {NAME: [OVERRIDE, ...] | {overrides: [...], seeds: [...], tokens: N}}   tokens: this arm's own
                                    budget (its schedule scales with it), for separate-budget arms
    borrow: {ARM: EXPERIMENT}       arms whose runs another experiment makes (compared here, not run here)
    eval: [ARG, ...]                `python -m nvfp4train.eval run_dir=RUN ARG...` after training
    eval_points: 20                 in-training validations per run (20: every 5% of the tokens); 0: the
                                    overrides' train.eval_every stands

Files whose name starts with `_` are includes, not experiments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class UsageError(Exception):
    """Bad input: one line for the user, exit code 2."""


def _configs_dir() -> Path:
    package = Path(__file__).resolve().parents[1]
    shipped = package / "configs"  # a wheel's copy; a source checkout has configs/ at the root
    return shipped if shipped.is_dir() else package.parent / "configs"


EXPERIMENTS_DIR = _configs_dir() / "reproduce"
KEYS = (
    "description",
    "tier",
    "include",
    "tokens",
    "seeds",
    "baseline",
    "base",
    "arms",
    "borrow",
    "eval",
    "eval_points",
)
TIERS = ("A", "B", "earlier")


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    tokens: int | None = None  # None: the experiment's


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    tier: str
    tokens: int
    seeds: tuple[int, ...]
    baseline: str
    base: tuple[str, ...]
    arms: dict[str, Arm]
    borrow: dict[str, str] = field(default_factory=dict)
    eval: tuple[str, ...] | None = None
    eval_points: int = 0
    path: Path | None = None

    def arm_source(self, arm: str) -> str:
        """The experiment whose runs of `arm` this one compares (itself, or the one it borrows from)."""
        return self.borrow.get(arm, self.name)

    @property
    def compared_arms(self) -> list[str]:
        """The baseline first, then the borrowed arms and the own arms, each once."""
        names = [self.baseline] + list(self.borrow) + list(self.arms)
        return list(dict.fromkeys(names))


def experiment_names(directory: Path = EXPERIMENTS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.yaml") if not p.name.startswith("_"))


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not valid YAML ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(spec, dict):
        raise UsageError(f"{path}: expected a mapping of {', '.join(KEYS)}")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}")
    return spec


def _int_list(path: Path, key: str, value) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise UsageError(f"{path}: {key}={value!r}; expected a non-empty list of seeds (integers >= 0)")
    if len(set(value)) != len(value):
        raise UsageError(f"{path}: {key}={value!r}; a seed is listed twice")
    return tuple(value)


def _str_list(path: Path, key: str, value) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise UsageError(f"{path}: {key}={value!r}; expected a list of KEY=VALUE overrides")
    return tuple(str(v) for v in value)


def _check_overrides(path: Path, key: str, overrides: list[str], command: str) -> None:
    """An experiment file's overrides, as the command line's are checked, and stricter: no resolver at all
    (an experiment file is shared: `${oc.env:VAR}` would copy the environment of whoever runs it into the
    runs' config.yaml). So `plan`, `run` and `status` refuse a file that names code (`hydra.callbacks`,
    `_target_`) or moves Hydra's files, before anything runs."""
    from nvfp4train.config import ConfigError, check_overrides

    try:
        check_overrides(overrides, command, resolvers=())
    except ConfigError as e:
        raise UsageError(f"{path}: {key}: {e}") from None


def load_experiment(name: str, directory: Path = EXPERIMENTS_DIR) -> Experiment:
    directory = Path(directory)
    path = directory / f"{name}.yaml"
    if name.startswith("_") or not path.is_file():
        raise UsageError(f"experiment {name!r}: no {path}; allowed: {', '.join(experiment_names(directory))}")
    own = _read_yaml(path)
    spec, base = {}, []
    if own.get("include") is not None:
        inc = directory / f"_{own['include']}.yaml"
        if not inc.is_file():
            raise UsageError(f"{path}: include={own['include']!r}: no {inc}")
        common = _read_yaml(inc)
        if "include" in common:
            raise UsageError(f"{inc}: include: an included file cannot include another")
        spec.update(common)
        base += list(_str_list(inc, "base", common.get("base")))
    spec.update(own)
    base += list(_str_list(path, "base", own.get("base")))
    for key in ("tokens", "seeds", "arms", "baseline"):
        if spec.get(key) in (None, [], {}):
            raise UsageError(f"{path}: {key} missing (in it or in its include)")
    tokens = spec["tokens"]
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise UsageError(f"{path}: tokens={tokens!r}; expected training tokens per run, an integer >= 1")
    seeds = _int_list(path, "seeds", spec["seeds"])
    tier = str(spec.get("tier", "earlier"))
    if tier not in TIERS:
        raise UsageError(f"{path}: tier={tier!r}; allowed: {', '.join(TIERS)}")
    if not isinstance(spec["arms"], dict):
        raise UsageError(f"{path}: arms: expected a mapping NAME: [overrides] or NAME: {{overrides, seeds}}")
    arms = {}
    for arm_name, arm_spec in spec["arms"].items():
        if isinstance(arm_spec, dict):
            extra = sorted(set(arm_spec) - {"overrides", "seeds", "tokens"})
            if extra:
                raise UsageError(
                    f"{path}: arms.{arm_name}: unknown key {extra[0]!r}; allowed: overrides, seeds, tokens"
                )
            arm_seeds = _int_list(path, f"arms.{arm_name}.seeds", arm_spec["seeds"]) if "seeds" in arm_spec else seeds
            arm_tokens = arm_spec.get("tokens")
            if arm_tokens is not None and (
                isinstance(arm_tokens, bool) or not isinstance(arm_tokens, int) or arm_tokens < 1
            ):
                raise UsageError(f"{path}: arms.{arm_name}.tokens={arm_tokens!r}; expected an integer >= 1")
            arms[arm_name] = Arm(
                arm_name, _str_list(path, f"arms.{arm_name}", arm_spec.get("overrides")), arm_seeds, arm_tokens
            )
        else:
            arms[arm_name] = Arm(arm_name, _str_list(path, f"arms.{arm_name}", arm_spec), seeds)
    borrow = spec.get("borrow") or {}
    if not isinstance(borrow, dict) or not all(isinstance(v, str) for v in borrow.values()):
        raise UsageError(f"{path}: borrow={borrow!r}; expected a mapping ARM: EXPERIMENT")
    # runs live in <runs-dir>/<experiment>/<arm>/: a name holding a path (.., /, an absolute one) would put them
    # elsewhere, outside --runs-dir
    named = [(f"arms.{a}", a) for a in arms] + [(f"borrow.{a}", v) for a, v in borrow.items() for v in (a, v)]
    for key, value in named:
        plain = isinstance(value, str) and value.isascii() and value[:1].isalnum()
        if not plain or not all(c.isalnum() or c in "_.+-" for c in value):
            raise UsageError(
                f"{path}: {key}: {value!r} is not a plain name (letters, digits and _ . + -, starting with a "
                "letter or digit): it names a directory of the runs"
            )
    for arm_name, source in borrow.items():
        if not (directory / f"{source}.yaml").is_file():
            raise UsageError(f"{path}: borrow.{arm_name}={source!r}: no experiment {directory / (source + '.yaml')}")
    if spec["baseline"] not in arms and spec["baseline"] not in borrow:
        raise UsageError(f"{path}: baseline {spec['baseline']!r} is neither one of its arms nor borrowed")
    eval_points = spec.get("eval_points", 0)
    if isinstance(eval_points, bool) or not isinstance(eval_points, int) or eval_points < 0:
        raise UsageError(f"{path}: eval_points={eval_points!r}; expected an integer >= 0 (20: every 5% of the tokens)")
    eval_args = spec.get("eval")
    _check_overrides(path, "base", base, "train")
    for arm in arms.values():
        _check_overrides(path, f"arms.{arm.name}", list(arm.overrides), "train")
    if eval_args is not None:
        _check_overrides(path, "eval", list(_str_list(path, "eval", eval_args)), "eval")
    return Experiment(
        name=name,
        description=" ".join(str(spec.get("description", "")).split()),
        tier=tier,
        tokens=tokens,
        seeds=seeds,
        baseline=str(spec["baseline"]),
        base=tuple(base),
        arms=arms,
        borrow=dict(borrow),
        eval=None if eval_args is None else _str_list(path, "eval", eval_args),
        eval_points=eval_points,
        path=path,
    )


def all_experiments(directory: Path = EXPERIMENTS_DIR) -> list[Experiment]:
    return [load_experiment(n, directory) for n in experiment_names(directory)]
