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
    sweep: {...}                    a grid over model size and tokens per parameter (below); `tokens` is
                                    then each cell's, from its size and tokens per parameter

A sweep runs its arms (the `arms` key, as in any experiment) in every cell of a grid:

    sweep:
      tokens_per_param: [20]        every size at these (tokens = this x the non-embedding parameters)
      min_lr_fraction: 0.01         optim.min_lr = this x the size's lr (default 0.01)
      sizes:                        in any order: `run` takes the cells by parameters x tokens, smallest first
        - model: hybrid_0p5m        a preset of configs/model/ (one family: the same pattern, so the same
          lr: 3.0e-3                BF16 blocks); lr: the peak, tuned on BF16 only, then every arm's
          name: s0p5m               the cell's directory part (default: the model's name)
          seeds: [1, 2, 3, 4, 5]    (default: the experiment's)
          tokens_per_param: [5, 80] (default: the sweep's)
          arms: [bf16, nvfp4]       the arms run at this size (default: every arm)
          borrow: b_fp8_vs_nvfp4    every arm of this size's cells is that experiment's run of the same
                                    arm and seed (run there, compared here); only at its token budget,
                                    and only where the runs would be the same (checked when read)

Each (size, tokens per parameter, arm) becomes an arm of its own, `<size>-tpp<T>-<arm>`, whose runs live in
<runs-dir>/<experiment>/<size>-tpp<T>-<arm>/seed<k>/; the model, optim.lr and optim.min_lr come from the size,
so `base` and the arms may not set them. A borrowed size's cells are planned with the source experiment's
out_dirs (`Arm.borrow`, `Experiment.source`): `run` leaves them to it, and `status`, `copy-results` and
`report` read its runs.

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
    "sweep",
)
SWEEP_KEYS = ("sizes", "tokens_per_param", "min_lr_fraction")
SIZE_KEYS = ("model", "lr", "name", "seeds", "tokens_per_param", "arms", "borrow")
SIZE_SET = ("model", "optim.lr", "optim.min_lr")  # what a sweep's sizes set, so no other override may
TIERS = ("A", "B", "earlier")


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    tokens: int | None = None  # None: the experiment's
    tokens_per_param: float | None = None  # a sweep's cell: tokens = this x the model's non-embedding parameters
    cell: tuple[str, float, str] | None = None  # a sweep's: (size, tokens per parameter, the arm it repeats)
    borrow: tuple[str, str] | None = None  # a sweep's borrowed cell: (the experiment that makes its runs, its arm)


@dataclass(frozen=True)
class Size:
    name: str
    model: str
    lr: float
    seeds: tuple[int, ...]
    tokens_per_param: tuple[float, ...]
    arms: tuple[str, ...]
    borrow: str | None = None  # the experiment whose runs every arm of this size's cells is


@dataclass(frozen=True)
class Sweep:
    sizes: tuple[Size, ...]
    arms: dict[str, Arm]  # the arms each cell repeats, as the file names them
    min_lr_fraction: float = 0.01
    lenders: dict[str, Experiment] = field(default_factory=dict, compare=False)  # the experiments borrowed from

    def cells(self) -> list[tuple[Size, float]]:
        return [(size, tpp) for size in self.sizes for tpp in size.tokens_per_param]


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
    sweep: Sweep | None = None

    def source(self, arm: str) -> tuple[str, str]:
        """The experiment whose runs of `arm` this one compares and the arm's name there: itself; the one it
        borrows the arm from (`borrow`); or, for a sweep's borrowed cell, the lender's arm it repeats."""
        own = self.arms.get(arm)
        if own is not None and own.borrow is not None:
            return own.borrow
        return self.borrow.get(arm, self.name), arm

    def arm_source(self, arm: str) -> str:
        """The experiment whose runs of `arm` this one compares (itself, or the one it borrows from)."""
        return self.source(arm)[0]

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


def load_experiment(name: str, directory: Path = EXPERIMENTS_DIR, lending_to: str | None = None) -> Experiment:
    """The experiment configs/reproduce/<name>.yaml, checked key by key. lending_to: the sweep key (`<file>:
    sweep.sizes[i].borrow`) that borrows this one's runs, which must then be an experiment of plain arms."""
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
    if lending_to is not None and spec.get("sweep") is not None:  # refused before its own sweep is read: no cycle
        raise UsageError(
            f"{lending_to}={name!r}: {path} is a sweep; a size borrows the runs of an experiment of plain arms "
            "(named as the sweep's arms)"
        )
    for key in (
        ("seeds", "arms", "baseline") if spec.get("sweep") is not None else ("tokens", "seeds", "arms", "baseline")
    ):
        if spec.get(key) in (None, [], {}):
            raise UsageError(f"{path}: {key} missing (in it or in its include)")
    tokens = spec.get("tokens", 0) if spec.get("sweep") is not None else spec["tokens"]
    if spec.get("sweep") is not None and tokens:
        raise UsageError(
            f"{path}: tokens={tokens!r} beside sweep; a sweep's tokens are each cell's (sweep.tokens_per_param)"
        )
    if spec.get("sweep") is None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
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
    sweep = None
    if spec.get("sweep") is not None:
        if borrow:
            raise UsageError(
                f"{path}: borrow beside sweep; a sweep borrows whole sizes (sweep.sizes[].borrow: EXPERIMENT), "
                "every arm of their cells"
            )
        sweep = _read_sweep(path, spec["sweep"], arms, spec["arms"], seeds, str(spec["baseline"]), base)
        arms = _sweep_arms(sweep)
    exp = Experiment(
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
        sweep=sweep,
    )
    if sweep is not None and sweep.lenders:
        from nvfp4train.reproduce.plan import check_borrowed_cells  # plan imports this module

        check_borrowed_cells(exp)
    return exp


def _number_list(path: Path, key: str, value) -> tuple[float, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise UsageError(f"{path}: {key}={value!r}; expected a non-empty list of numbers > 0")
    if len(set(value)) != len(value):
        raise UsageError(f"{path}: {key}={value!r}; a value is listed twice")
    return tuple(float(v) for v in value)


def _plain_name(value) -> bool:
    return (
        isinstance(value, str)
        and value.isascii()
        and value[:1].isalnum()
        and all(c.isalnum() or c in "_.+-" for c in value)
    )


def _read_sweep(
    path: Path, spec, arms: dict[str, Arm], arms_spec: dict, seeds: tuple[int, ...], baseline: str, base: list[str]
) -> Sweep:
    """The `sweep` key, checked key by key (one line naming the key and what is allowed)."""
    for name, arm_spec in arms_spec.items():
        for key in ("seeds", "tokens"):
            if isinstance(arm_spec, dict) and key in arm_spec:
                raise UsageError(
                    f"{path}: arms.{name}.{key} beside sweep; a sweep's seeds and tokens are each size's "
                    "(sweep.sizes[].seeds, sweep.tokens_per_param)"
                )
    if not isinstance(spec, dict):
        raise UsageError(f"{path}: sweep: expected a mapping of {', '.join(SWEEP_KEYS)}")
    unknown = sorted(set(spec) - set(SWEEP_KEYS))
    if unknown:
        raise UsageError(f"{path}: sweep: unknown key {unknown[0]!r}; allowed: {', '.join(SWEEP_KEYS)}")
    for where, overrides in [("base", base)] + [(f"arms.{a.name}", a.overrides) for a in arms.values()]:
        for o in overrides:
            key = str(o).split("=", 1)[0].lstrip("+~")
            if key in SIZE_SET:
                raise UsageError(
                    f"{path}: {where}: {o!r} beside sweep; each size sets {', '.join(SIZE_SET)} "
                    "(sweep.sizes[].model and .lr)"
                )
    default_tpp = (
        _number_list(path, "sweep.tokens_per_param", spec["tokens_per_param"]) if "tokens_per_param" in spec else None
    )
    fraction = spec.get("min_lr_fraction", 0.01)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise UsageError(f"{path}: sweep.min_lr_fraction={fraction!r}; expected a number in [0, 1]")
    lenders: dict[str, Experiment] = {}
    sizes_spec = spec.get("sizes")
    if not isinstance(sizes_spec, list) or not sizes_spec:
        raise UsageError(f"{path}: sweep.sizes={sizes_spec!r}; expected a non-empty list of {{model, lr, ...}}")
    models = sorted(p.stem for p in (_configs_dir() / "model").glob("*.yaml"))
    sizes, names = [], set()
    for i, entry in enumerate(sizes_spec):
        key = f"sweep.sizes[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: {key}={entry!r}; expected a mapping of {', '.join(SIZE_KEYS)}")
        unknown = sorted(set(entry) - set(SIZE_KEYS))
        if unknown:
            raise UsageError(f"{path}: {key}: unknown key {unknown[0]!r}; allowed: {', '.join(SIZE_KEYS)}")
        model = entry.get("model")
        if not isinstance(model, str) or model not in models:
            raise UsageError(
                f"{path}: {key}.model={model!r}; allowed: the presets of configs/model/: {', '.join(models)}"
            )
        lr = entry.get("lr")
        if isinstance(lr, str):  # YAML reads 3e-3 (no dot) as text
            try:
                lr = float(lr)
            except ValueError:
                pass
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
            raise UsageError(
                f"{path}: {key}.lr={lr!r}; expected the peak learning rate, a number in (0, 1), tuned on BF16"
            )
        name = entry.get("name", model)
        if not _plain_name(name):
            raise UsageError(
                f"{path}: {key}.name={name!r} is not a plain name (letters, digits and _ . + -, starting with a "
                "letter or digit): it names a directory of the runs"
            )
        if name in names:
            raise UsageError(f"{path}: {key}.name={name!r}: two sizes share it; give each its own name")
        names.add(name)
        tpp = (
            _number_list(path, f"{key}.tokens_per_param", entry["tokens_per_param"])
            if "tokens_per_param" in entry
            else default_tpp
        )
        if tpp is None:
            raise UsageError(f"{path}: {key}: no tokens_per_param (give sweep.tokens_per_param or the size's own)")
        size_arms = entry.get("arms", list(arms))
        if not isinstance(size_arms, list) or not size_arms or not all(a in arms for a in size_arms):
            raise UsageError(f"{path}: {key}.arms={size_arms!r}; expected a list of the file's arms: {', '.join(arms)}")
        if baseline not in size_arms:
            raise UsageError(
                f"{path}: {key}.arms={size_arms!r} lacks the baseline {baseline!r}: every cell compares against it"
            )
        size_seeds = _int_list(path, f"{key}.seeds", entry["seeds"]) if "seeds" in entry else seeds
        source = entry.get("borrow")
        if source is not None:
            _lend(path, key, source, size_arms, size_seeds, lenders)
        sizes.append(Size(name, model, float(lr), size_seeds, tpp, tuple(size_arms), source))
    return Sweep(tuple(sizes), dict(arms), float(fraction), lenders)


def _lend(path: Path, key: str, source, size_arms: list[str], size_seeds: tuple[int, ...], lenders: dict) -> None:
    """A size's `borrow: EXPERIMENT`: the experiment (and, for an arm it borrows itself, the one it borrows
    from) loaded into `lenders`, every arm of the size one of its arms and every seed one of that arm's seeds.
    Whether the runs would be the same is `plan.check_borrowed_cells`' (it composes their configs)."""
    where = f"{path}: {key}.borrow"
    if not _plain_name(source):
        raise UsageError(f"{where}={source!r}; expected the name of an experiment of {path.parent}")
    if not (path.parent / f"{source}.yaml").is_file():
        raise UsageError(f"{where}={source!r}: no experiment {path.parent / (source + '.yaml')}")
    if source not in lenders:
        lenders[source] = load_experiment(source, path.parent, lending_to=where)
    lender = lenders[source]
    for arm in size_arms:
        maker = lender.arm_source(arm)
        if arm not in lender.arms and arm not in lender.borrow:
            raise UsageError(
                f"{where}={source!r}: arm {arm!r} of the size is not an arm of {source} (its arms, own and "
                f"borrowed: {', '.join(lender.compared_arms)}); give the size only those (sweep.sizes[].arms)"
            )
        if maker not in lenders:
            lenders[maker] = load_experiment(maker, path.parent, lending_to=where)
        if arm not in lenders[maker].arms:
            raise UsageError(f"{where}={source!r}: {source} borrows arm {arm!r} from {maker}, which has no arm {arm!r}")
        theirs = lenders[maker].arms[arm].seeds
        missing = [s for s in size_seeds if s not in theirs]
        if missing:
            raise UsageError(
                f"{where}={source!r}: seed {missing[0]} of the size is not among {maker}'s seeds of {arm} "
                f"({', '.join(map(str, theirs))}); give the size only those (sweep.sizes[].seeds)"
            )


def tpp_text(tpp: float) -> str:
    return f"{tpp:g}"


def _sweep_arms(sweep: Sweep) -> dict[str, Arm]:
    """Every (size, tokens per parameter, arm) as an arm of its own (the module doc); a borrowed size's arms
    say whose runs they are (`Arm.borrow`)."""
    out = {}
    for size, tpp in sweep.cells():
        sets = [f"model={size.model}", f"optim.lr={size.lr:g}", f"optim.min_lr={size.lr * sweep.min_lr_fraction:g}"]
        for template in size.arms:
            name = f"{size.name}-tpp{tpp_text(tpp)}-{template}"
            lender = None if size.borrow is None else (sweep.lenders[size.borrow].arm_source(template), template)
            out[name] = Arm(
                name,
                tuple(sets) + sweep.arms[template].overrides,
                size.seeds,
                None,
                tpp,
                (size.name, tpp, template),
                lender,
            )
    return out


def all_experiments(directory: Path = EXPERIMENTS_DIR) -> list[Experiment]:
    return [load_experiment(n, directory) for n in experiment_names(directory)]
