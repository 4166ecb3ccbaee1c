"""`python -m nvfp4train.reproduce tune-lr SWEEP`: the per-size peak learning rate a sweep asks for
(`sweep.sizes[].lr`: tuned on BF16 only, then fixed for every arm), from BF16 runs of its baseline arm at the
file's lr times each of a few factors.

The scan is a sweep of its own, `<sweep>_lr`, made in memory from the file (which is never written): per size
that is not borrowed, one size `<size>-lr<lr>` per factor with the baseline arm only, the scan's seeds and one
tokens per parameter, so that `plan_experiment`, the local executor and the run directories are a sweep's:
<runs-dir>/<sweep>_lr/<size>-lr<lr>-tpp<T>-<baseline>/seed<k>/, with optim.min_lr the sweep's min_lr_fraction of
each scanned lr. A borrowed size keeps the lr of its lender's runs (`check_borrowed_cells` holds the file's
equal to it) and is not scanned.

The table, per size and lr: the seeds finished, the final checkpoint's BF16 held-out loss of each (eval.json's
heldout_mean_loss, read as `report` reads it) and their mean, the lowest mean marked; a best at either end of
the grid says that the optimum may lie outside it and which factor to add. Then the lines to write into the
sweep's file.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from nvfp4train.reproduce.experiments import Experiment, Size, Sweep, UsageError, _sweep_arms

DEFAULT_FACTORS = (0.5, 0.707, 1.0, 1.414, 2.0)
DEFAULT_TOKENS_PER_PARAM = 20.0


@dataclass(frozen=True)
class Point:
    """One lr of a size: the file's size (sweep.sizes[index]), the factor, the lr and the scan's arm."""

    size: Size
    index: int
    factor: float
    lr: float
    arm: str


@dataclass(frozen=True)
class Scan:
    exp: Experiment  # the scan, a sweep: <sweep>_lr
    source: Experiment  # the sweep whose lr it tunes
    factors: tuple[float, ...]
    tokens_per_param: dict[str, float]  # the file's size name -> the scan's tokens per parameter there
    points: tuple[Point, ...]
    notes: tuple[str, ...]  # borrowed sizes, budgets the sweep does not run


def parse_factors(text: str) -> tuple[float, ...]:
    values: list[float] = []
    for word in str(text).split(","):
        try:
            value = float(word)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise UsageError(
                f"--factors {text}: {word.strip()!r} is not a number > 0; expected multiples of each size's lr, "
                f"e.g. {','.join(f'{f:g}' for f in DEFAULT_FACTORS)}"
            )
        if value in values:
            raise UsageError(f"--factors {text}: {value:g} is listed twice; give each factor once")
        values.append(value)
    return tuple(values)


def parse_seeds(text: str) -> tuple[int, ...]:
    words = str(text).split(",")
    if not all(w.strip().isdigit() for w in words):
        raise UsageError(f"--seeds {text}: expected comma-separated seeds, integers >= 0")
    seeds = [int(w) for w in words]
    if len(set(seeds)) < len(seeds):
        raise UsageError(f"--seeds {text}: a seed is listed twice")
    return tuple(seeds)


def parse_tokens_per_param(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--tokens-per-param {text}: expected a number > 0 (training tokens per parameter)")
    return value


def baseline_precision(exp: Experiment) -> tuple[str | None, str]:
    """The precision the baseline arm selects (the last `precision=` of base and its overrides; None where
    neither selects one) and the key that selects it."""
    chosen, where = None, f"arms.{exp.baseline}"
    arm = exp.sweep.arms[exp.baseline] if exp.sweep is not None else exp.arms.get(exp.baseline)
    for key, overrides in (("base", exp.base), (f"arms.{exp.baseline}", arm.overrides if arm else ())):
        for override in overrides:
            name, _, value = str(override).partition("=")
            if name.lstrip("+") == "precision":
                chosen, where = value, key
            elif name == "~precision":
                chosen, where = None, key
    return chosen, where


def lr_scan(
    exp: Experiment,
    factors: tuple[float, ...] = DEFAULT_FACTORS,
    seeds: tuple[int, ...] = (1,),
    tokens_per_param: float | None = None,
) -> Scan:
    """The scan of `exp`'s sizes (the module doc); UsageError in one line for a file that is not a sweep, a
    baseline arm that does not train in BF16, or factors that give no lr in (0, 1) or twice the same one."""
    path = exp.path
    if exp.sweep is None:
        raise UsageError(
            f"{path}: no sweep key; tune-lr tunes a sweep's per-size learning rate (sweep.sizes[].lr), and "
            f"{exp.name} is an experiment of plain arms (its lr is in its overrides)"
        )
    precision, where = baseline_precision(exp)
    if precision != "bf16":
        said = f"precision={precision}" if precision is not None else "no precision= (the trainer's default)"
        raise UsageError(
            f"{path}: {where}: the baseline arm {exp.baseline!r} selects {said}; tune-lr tunes the lr on BF16 "
            f"only, so the baseline's overrides must set precision=bf16"
        )
    name = f"{exp.name}_lr"
    if path is not None and (path.parent / f"{name}.yaml").is_file():
        raise UsageError(
            f"{path.parent / (name + '.yaml')}: an experiment named {name}, which is the name of {exp.name}'s lr "
            "scan (its runs' directory): rename that file"
        )
    sizes, points, notes, budgets = [], [], [], {}
    for i, size in enumerate(exp.sweep.sizes):
        if size.borrow is not None:
            notes.append(f"{size.name}: borrowed from {size.borrow}, keeps its lender's lr {size.lr:g}; not scanned")
            continue
        tpp = tokens_per_param
        if tpp is None:
            has_default = DEFAULT_TOKENS_PER_PARAM in size.tokens_per_param
            tpp = DEFAULT_TOKENS_PER_PARAM if has_default else min(size.tokens_per_param)
        elif tpp not in size.tokens_per_param:
            notes.append(
                f"{size.name}: scanned at {tpp:g} tokens per parameter, which the sweep does not run at this "
                f"size (it runs {', '.join(f'{t:g}' for t in size.tokens_per_param)})"
            )
        budgets[size.name] = tpp
        made: dict[str, float] = {}
        for factor in factors:
            lr = float(f"{size.lr * factor:g}")  # the value the run's optim.lr= says
            if not 0 < lr < 1:
                raise UsageError(
                    f"--factors: {factor:g} x {path}: sweep.sizes[{i}].lr={size.lr:g} is {lr:g}; expected a peak "
                    "learning rate in (0, 1)"
                )
            scan_size = f"{size.name}-lr{lr:g}"
            if scan_size in made:
                raise UsageError(
                    f"--factors: {made[scan_size]:g} and {factor:g} give {size.name} the same lr {lr:g}; "
                    "give factors further apart"
                )
            made[scan_size] = factor
            sizes.append(Size(scan_size, size.model, lr, tuple(seeds), (tpp,), (exp.baseline,)))
            points.append(Point(size, i, factor, lr, f"{scan_size}-tpp{tpp:g}-{exp.baseline}"))
    if not sizes:
        raise UsageError(
            f"{path}: every size of the sweep is borrowed (sweep.sizes[].borrow): its lr is its lender's, "
            "nothing to tune here"
        )
    sweep = Sweep(tuple(sizes), {exp.baseline: exp.sweep.arms[exp.baseline]}, exp.sweep.min_lr_fraction)
    scan = Experiment(
        name=name,
        description=f"the BF16 learning-rate scan of {exp.name} (tune-lr)",
        tier=exp.tier,
        tokens=0,
        seeds=tuple(seeds),
        baseline=exp.baseline,
        base=exp.base,
        arms=_sweep_arms(sweep),
        eval=exp.eval,
        eval_points=exp.eval_points,
        path=path,
        sweep=sweep,
    )
    return Scan(scan, exp, tuple(factors), budgets, tuple(points), tuple(notes))


def header_lines(scan: Scan, runs: list, runs_dir: Path) -> list[str]:
    """What the scan trains: sizes x factors x seeds, then per size its budget and lrs."""
    by_size: dict[str, list[Point]] = {}
    for point in scan.points:
        by_size.setdefault(point.size.name, []).append(point)
    first = {run.arm: run for run in runs}
    lines = [
        f"{scan.exp.name}: {scan.exp.description}: {len(by_size)} size(s) x {len(scan.factors)} factor(s) "
        f"({', '.join(f'{f:g}' for f in scan.factors)}) x seed(s) {', '.join(map(str, scan.exp.seeds))} = "
        f"{len(runs)} run(s) of arm {scan.exp.baseline}, in {Path(runs_dir) / scan.exp.name}/",
    ]
    for size_name, points in by_size.items():
        run = first.get(points[0].arm)
        budget = "" if run is None else f", {run.tokens:,} tokens ({run.max_steps} steps)"
        lines.append(
            f"  {size_name} at {scan.tokens_per_param[size_name]:g} tokens per parameter{budget}: lr "
            + ", ".join(f"{p.lr:g}" for p in points)
            + f" (the file's {points[0].size.lr:g} x each factor; optim.min_lr "
            f"{scan.source.sweep.min_lr_fraction:g} x the lr)"
        )
    return lines + [f"  {note}" for note in scan.notes]


def _neighbour(factors: tuple[float, ...], low: bool) -> float:
    """The factor to add past an end of the grid: one step of the grid's own spacing beyond it."""
    ordered = sorted(factors)
    if len(ordered) < 2:
        return ordered[0] / 2 if low else ordered[0] * 2
    end, inner = (ordered[0], ordered[1]) if low else (ordered[-1], ordered[-2])
    return float(f"{end * end / inner:.3g}")


def table_lines(scan: Scan, runs: list) -> list[str]:
    """Per size, each lr's finished seeds, BF16 held-out losses and their mean, the best marked and an end of
    the grid flagged; then the `sweep.sizes` lines to write into the file. RunError where a run's files are
    damaged or disagree (as `report`)."""
    from nvfp4train.reproduce.claims import Precision
    from nvfp4train.reproduce.report import final_eval, load_run

    by_arm: dict[str, list] = {}
    for run in runs:
        by_arm.setdefault(run.arm, []).append(run)
    by_size: dict[str, list[Point]] = {}
    for point in scan.points:
        by_size.setdefault(point.size.name, []).append(point)
    lines: list[str] = []
    best_of: dict[str, tuple[Point, bool]] = {}
    for size_name, points in by_size.items():
        size, index = points[0].size, points[0].index
        rows = []
        for point in points:
            planned = sorted(by_arm.get(point.arm, []), key=lambda r: r.seed)
            losses = {}
            for run in planned:
                data = load_run(run.out_dir, scan.exp.name, run.arm, run.seed)
                loss = None if data is None else final_eval(data, Precision.BF16)
                if loss is not None:
                    losses[run.seed] = loss
            mean = statistics.fmean(losses.values()) if losses else None
            rows.append((point, len(planned), losses, mean))
        measured = [row for row in rows if row[3] is not None]
        best = min(measured, key=lambda row: row[3]) if measured else None
        lines += [""] if lines else []
        lines.append(
            f"{size_name} (sweep.sizes[{index}], lr {size.lr:g} in the file) at "
            f"{scan.tokens_per_param[size_name]:g} tokens per parameter: the final BF16 held-out loss "
            "(eval.json heldout_mean_loss)"
        )
        lines.append(f"  {'factor':>7} {'lr':>11} {'seeds':>6} {'mean':>9}  seed: loss")
        for row in rows:
            point, planned, losses, mean = row
            lines.append(
                f"  {point.factor:>7g} {point.lr:>11g} {f'{len(losses)}/{planned}':>6} "
                f"{'-' if mean is None else f'{mean:.5f}':>9}  "
                + ("  ".join(f"{s}: {losses[s]:.5f}" for s in sorted(losses)) or "-")
                + ("  <- best" if row is best else "")
            )
        if best is None:
            lines.append(f"  no finished run of {size_name} yet")
            continue
        if len({len(row[2]) for row in measured}) > 1:
            lines.append("  (the means are over different numbers of seeds: the best may change as runs finish)")
        if len(measured) < len(rows):
            lines.append(f"  ({len(rows) - len(measured)} lr(s) without a finished run: the best may change)")
        point = best[0]
        edge = point.factor in (min(scan.factors), max(scan.factors))
        if edge and len(scan.factors) == 1:
            around = ",".join(f"{f:g}" for f in (point.factor / 2, point.factor, point.factor * 2))
            lines.append(
                f"  {size_name}: one factor only: the optimum may lie either side of it; add factors below and "
                f"above it (--factors {around})"
            )
        elif edge:
            low = point.factor == min(scan.factors)
            add = _neighbour(scan.factors, low)
            grid = ",".join(f"{f:g}" for f in sorted((*scan.factors, add)))
            lines.append(
                f"  {size_name}: the best lr is at the grid's {'lowest' if low else 'highest'} factor "
                f"({point.factor:g}): the optimum may lie {'below' if low else 'above'} it; add factor {add:g} "
                f"(--factors {grid})"
            )
        best_of[size_name] = (point, edge)
    lines.append("")
    where = scan.source.path or f"{scan.source.name}.yaml"
    lines.append(f"The lr to write into {where} (sweep.sizes[]; tune-lr leaves the file as it is):")
    for size_name, points in by_size.items():
        size = points[0].size
        if size_name not in best_of:
            lines.append(f"  # {size_name}: no finished run yet")
            continue
        point, edge = best_of[size_name]
        lines.append(f"  - model: {size.model}")
        if size.name != size.model:
            lines.append(f"    name: {size.name}")
        lines.append(f"    lr: {point.lr:g}" + ("  # at an end of the grid: see above" if edge else ""))
    return lines
