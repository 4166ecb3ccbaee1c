"""Sweeps over model size and tokens per parameter: the experiment file's grid (plan, status, run order,
bad keys), the fitted law and trend against known truth (synthetic sweeps drawn from a law plus seed noise),
and `predict` and the report's sweep section on run directories written as the executor writes them."""

from __future__ import annotations

import json
import math
import re
import textwrap

import numpy as np
import pytest
import yaml

from nvfp4train.reproduce.__main__ import main
from nvfp4train.reproduce.experiments import UsageError, load_experiment
from nvfp4train.reproduce.plan import plan_experiment
from nvfp4train.reproduce.scaling import Cell, fit_sweep, parse_count

TRUE = {"A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28, "E": 1.69}


def law(n, d, c=1.0, true=TRUE):
    return true["A"] * (c * n) ** -true["alpha"] + true["B"] * d ** -true["beta"] + true["E"]


def synthetic(rng, grid, gap, seeds=3, sd_seed=0.01, sd_arm=0.004):
    """Cells whose BF16 loss follows TRUE and whose nvfp4 loss is gap(n, d, bf16 loss); every seed shifts
    both arms alike (the pairing) and each arm a little of its own."""
    cells = []
    for n, tpp in grid:
        d = n * tpp
        losses = {"bf16": {}, "nvfp4": {}}
        for s in range(seeds):
            shared = rng.normal(0, sd_seed)
            losses["bf16"][s] = law(n, d) + shared + rng.normal(0, sd_arm)
            losses["nvfp4"][s] = gap(n, d, law(n, d)) + shared + rng.normal(0, sd_arm)
        cells.append(Cell(f"n{n:g}", n, d, losses))
    return cells


GRID = [(n, t) for n in (5e5, 1.5e6, 3e6, 5e6) for t in (5, 20, 80)]


def test_a_synthetic_law_is_given_back_inside_its_intervals_at_about_the_stated_rate():
    """100 sweeps drawn from TRUE with NVFP4 at c = 0.7: each 90% interval (100 paired bootstrap replicates)
    holds the true value in 78-97% of them."""
    rng = np.random.default_rng(1)
    hits = dict.fromkeys([*TRUE, "c"], 0)
    replicates = 100
    for r in range(replicates):
        cells = synthetic(rng, GRID, lambda n, d, _: law(n, d, 0.7))
        fit = fit_sweep(cells, "bf16", ["nvfp4"], bootstrap=100, level=0.9, seed=r)
        for k, v in TRUE.items():
            lo, hi = fit.law_interval(k)
            hits[k] += lo <= v <= hi
        lo, hi = fit.c_interval("nvfp4")
        hits["c"] += lo <= 0.7 <= hi
    rates = {k: v / replicates for k, v in hits.items()}
    assert all(0.78 <= rate <= 0.97 for rate in rates.values()), rates


def test_the_trend_gives_back_known_slopes_per_decade_at_about_the_stated_rate():
    """A gap of 1.5% + 0.4% per decade of N - 0.6% per decade of D/N: the slopes' 90% intervals hold them in
    78-97% of 100 sweeps, and the point estimates centre on them."""
    rng = np.random.default_rng(2)
    centre_n, centre_r = (math.log10(5e5) + math.log10(5e6)) / 2, (math.log10(5) + math.log10(80)) / 2

    def gap(n, d, bf16):
        return bf16 * (1 + (1.5 + 0.4 * (math.log10(n) - centre_n) - 0.6 * (math.log10(d / n) - centre_r)) / 100)

    hits, points = {"n": 0, "r": 0}, {"n": [], "r": []}
    for r in range(100):
        fit = fit_sweep(synthetic(rng, GRID, gap), "bf16", ["nvfp4"], bootstrap=100, level=0.9, seed=r)
        for axis, true in (("n", 0.4), ("r", -0.6)):
            point, lo, hi = fit.slope("nvfp4", axis)
            hits[axis] += lo <= true <= hi
            points[axis].append(point)
    assert all(0.78 <= h / 100 <= 0.97 for h in hits.values()), hits
    assert abs(np.mean(points["n"]) - 0.4) < 0.05 and abs(np.mean(points["r"]) + 0.6) < 0.05


def test_a_flat_law_gives_slope_intervals_that_hold_zero():
    rng = np.random.default_rng(3)
    fit = fit_sweep(synthetic(rng, GRID, lambda n, d, bf16: bf16), "bf16", ["nvfp4"], bootstrap=200)
    for axis in ("n", "r"):
        point, lo, hi = fit.slope("nvfp4", axis)
        assert lo < 0 < hi, (axis, point, lo, hi)
    lo, hi = fit.c_interval("nvfp4")
    assert lo < 1 < hi


def test_the_trend_predicts_nothing_off_an_axis_measured_at_one_value():
    """Sizes at one D/N: the gap's trend over N is measured, but a question at another D/N has no slope to
    carry it there (not a flat extrapolation), and one at the measured D/N gets a prediction."""
    from nvfp4train.reproduce.scaling import predict as predict_gap

    rng = np.random.default_rng(4)
    grid = [(n, 20) for n in (5e5, 1.5e6, 3e6, 5e6)]
    fit = fit_sweep(synthetic(rng, grid, lambda n, d, bf16: 1.01 * bf16), "bf16", ["nvfp4"], bootstrap=50)
    assert math.isfinite(fit.slope("nvfp4", "n")[0]) and not math.isfinite(fit.slope("nvfp4", "r")[0])
    on_axis = predict_gap(fit, "nvfp4", 1e7, 20 * 1e7)
    assert all(math.isfinite(v) for v in on_axis.trend_pct)
    off_axis = predict_gap(fit, "nvfp4", 1e7, 900 * 1e7)
    assert not any(math.isfinite(v) for v in off_axis.trend_pct)


@pytest.mark.parametrize(
    "text, value", [("12B", 12e9), ("1.2e10", 1.2e10), ("10T", 10e12), ("350m", 350e6), ("1_000", 1e3), ("x", None)]
)
def test_counts_read_as_a_user_writes_them(text, value):
    assert parse_count(text) == value


# ------------------------------------------------------------------------------ the example file
def grid_rows(out: str) -> dict[str, list[str]]:
    """A plan's grid, cell by cell, smallest first: the words of each row."""
    return {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"  hybrid_\w+-tpp", line)}


def test_plan_of_the_example_sweep_prints_the_grid_smallest_first_with_measured_or_unmeasured_hours(tmp_path, capsys):
    """Without its borrow (a copy of the file), the example plans every cell: hybrid_5m is the measured one."""
    text = load_experiment("sweep_size").path.read_text()
    assert "borrow: b_fp8_vs_nvfp4" in text
    (tmp_path / "sweep_size.yaml").write_text(re.sub(r"\n +borrow: .*\n(?: +#.*\n)*", "\n", text))
    assert main(["--experiments-dir", str(tmp_path), "plan", "sweep_size"]) == 0
    out = capsys.readouterr().out
    rows = grid_rows(out)
    cells = list(rows)
    assert cells[0] == "hybrid_0p5m-tpp20" and cells[-1] == "hybrid_5m-tpp20" and len(cells) == 6
    assert rows["hybrid_0p5m-tpp20"][6] == "unmeasured"  # no benchmark of that preset: no number invented
    assert re.fullmatch(r"\d+\.\d\d", rows["hybrid_5m-tpp20"][6])  # hybrid_5m is benchmarked on an H100
    assert "mxfp4 x5" in " ".join(rows["hybrid_0p5m-tpp20"]) and "mxfp4" not in " ".join(rows["hybrid_5m-tpp20"])
    assert {rows[f"hybrid_1p5m-tpp{t}"][2] for t in (5, 20, 80)} == {"5", "20", "80"}
    assert "74 run(s)" in out and "borrowed" not in out
    # the cell's arms run its size's model and lr (BF16-tuned, the same for every arm)
    assert "model=hybrid_0p5m optim.lr=0.003 optim.min_lr=3e-05 precision=nvfp4" in out


def test_the_example_sweep_borrows_tier_b_runs_for_hybrid_5m_and_counts_only_its_own(capsys):
    """hybrid_5m at 20 tokens per parameter is b_fp8_vs_nvfp4's runs (the same commands): planned in its
    directories, not among the runs or GPU-hours the sweep makes."""
    exp = load_experiment("sweep_size")
    runs = plan_experiment(exp)
    tier_b = {(r.arm, r.seed): r for r in plan_experiment(load_experiment("b_fp8_vs_nvfp4"))}
    borrowed = [r for r in runs if r.source is not None]
    assert len(runs) == 74 and len(borrowed) == 9
    assert {exp.arms[r.arm].cell[:2] for r in borrowed} == {("hybrid_5m", 20.0)}
    for run in borrowed:
        lent = tier_b[(run.source[1], run.seed)]
        assert run.source[0] == "b_fp8_vs_nvfp4" and run.out_dir == lent.out_dir
        assert run.train_overrides == lent.train_overrides and run.max_steps == lent.max_steps
    assert main(["plan", "sweep_size"]) == 0
    out = capsys.readouterr().out
    row = grid_rows(out)["hybrid_5m-tpp20"]
    assert row[6] == "borrowed" and "(the runs of b_fp8_vs_nvfp4)" in " ".join(row)
    assert "  65 run(s): 0.00 GPU-hours for the 0 measured" in out and "9 more borrowed, not run here" in out
    assert out.rstrip().endswith("65 run(s); 9 borrowed (9 of b_fp8_vs_nvfp4)")
    assert out.count("borrowed: b_fp8_vs_nvfp4/") == 9 and "out_dir=runs/repro/sweep_size/hybrid_5m" not in out
    assert out.count("python -m nvfp4train.train ") == 65


def test_status_of_the_example_sweep_shows_the_grid(tmp_path, capsys):
    assert main(["status", "sweep_size", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sweep_size: the grid" in out
    assert re.search(r"hybrid_0p5m-tpp20 +bf16 0/5, fp8_blockwise 0/5, nvfp4 0/5, mxfp4 0/5", out)


# --------------------------------------------------------------------------------- a small sweep
SWEEP = """
description: a small sweep
seeds: [1, 2, 3]
baseline: bf16
base: [data=bundled, train.seq_len=64, train.global_batch_size=8]
eval: [heldout_sequences=8, eval_precision=both]
arms:
  bf16: [precision=bf16]
  nvfp4: [precision=nvfp4]
sweep:
  tokens_per_param: [20]
  sizes:
    - {model: hybrid_0p5m, lr: 3.0e-3, tokens_per_param: [5, 20, 80]}
    - {model: hybrid_1p5m, lr: 2.0e-3, tokens_per_param: [5, 20]}
    - {model: hybrid_3m, lr: 1.7e-3}
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A small sweep's experiments dir and finished runs (config.yaml, metrics.jsonl, run.json, eval.json
    as the trainer and executor write them), their losses drawn from TRUE with NVFP4 worth c = 0.6."""
    root = tmp_path_factory.mktemp("sweep")
    (root / "experiments").mkdir()
    (root / "experiments" / "small_sweep.yaml").write_text(SWEEP)
    exp = load_experiment("small_sweep", root / "experiments")
    write_finished(exp, plan_experiment(exp, root / "runs"), np.random.default_rng(0))
    return root


def write_finished(exp, runs, rng, c=0.6, shift=0.0):
    """Finished runs of a sweep in their out_dirs (a borrowed one's: its lender's, named as the lender names
    it), their final losses drawn from TRUE with NVFP4 worth c, plus `shift`."""
    shared = {}
    for run in runs:
        size, tpp, arm = exp.arms[run.arm].cell
        n, t = run.info["params"], run.info["per_step"]
        shared.setdefault((size, tpp, run.seed), rng.normal(0, 0.01))
        loss = law(n, run.tokens, c if arm == "nvfp4" else 1.0) + shared[(size, tpp, run.seed)] + shift
        loss += rng.normal(0, 0.003)
        tp = loss + (0.01 if arm == "nvfp4" else 0.0)  # the forward pass's quantization, in the training precision
        run.out_dir.mkdir(parents=True)
        config = {
            "model": run.info["model"],
            "data": run.info["data"],
            "precision": {"name": run.precision},
            "seed": run.seed,
            "train": {"max_steps": run.max_steps, "global_batch_size": 8, "seq_len": 64, "eval_precision": "both"},
        }
        (run.out_dir / "config.yaml").write_text(yaml.safe_dump(config))
        records = [{"step": s, "tokens": s * t, "loss": loss + 1.0 / s} for s in (1, run.max_steps)]
        (run.out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        experiment, arm_name = run.home
        info = {
            "state": "done",
            "experiment": experiment,
            "arm": arm_name,
            "seed": run.seed,
            "max_steps": run.max_steps,
        }
        (run.out_dir / "run.json").write_text(json.dumps(dict(info, tokens=run.tokens, gpu="test", commit="abc")))
        evaluation = {
            "step": run.max_steps,
            "tokens": run.tokens,
            "eval_precision": "both",
            "heldout": {"text": {"loss": loss, "tokens": 512}},
            "heldout_mean_loss": loss,
            "heldout_tp": {"text": {"loss": tp, "tokens": 512}},
        }
        (run.out_dir / "eval.json").write_text(json.dumps(evaluation))


def predict(sweep, *words, runs=None):
    runs = runs or sweep / "runs"
    return main(["--experiments-dir", str(sweep / "experiments"), "predict", *words, "--runs-dir", str(runs)])


def test_predict_inside_the_sweep_gives_the_gap_with_its_interval(sweep, capsys):
    assert predict(sweep, "model=hybrid_1p5m", "tokens=30M", "precision=nvfp4") == 0
    out = capsys.readouterr().out
    assert "inside the measured range" in out
    law_lines = [line for line in out.splitlines() if "law (Kumar" in line]
    assert len(law_lines) == 2  # BF16-evaluated and in the training precision
    point, lo, hi = map(float, re.search(r"gap ([+-][\d.]+)% \[([+-][\d.]+), ([+-][\d.]+)\]", law_lines[0]).groups())
    assert 0 < lo < point < hi
    c = float(re.search(r"c = ([\d.]+)", law_lines[0]).group(1))
    assert 0.4 < c < 0.8  # drawn at 0.6


def test_predict_past_the_limit_is_one_line_and_extrapolate_prints_the_distance(sweep, capsys):
    assert predict(sweep, "model=nemotron_h_12b", "tokens=10T", "precision=nvfp4") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert re.search(r"lies 3\.\d\d decade\(s\) of N and 1\.\d\d of D/N outside", captured.err)
    assert "--extrapolate" in captured.err and "Traceback" not in captured.err
    assert predict(sweep, "model=12B", "tokens=10T", "precision=nvfp4", "--extrapolate") == 0
    out = capsys.readouterr().out
    assert re.search(r"extrapolated 3\.\d\d decade\(s\) of N and 1\.\d\d of D/N beyond it", out)
    assert re.search(r"gap [+-][\d.]+% \[[+-][\d.]+, [+-][\d.]+\]", out)


def test_predict_without_sweep_runs_says_how_to_make_them(sweep, tmp_path, capsys):
    assert predict(sweep, "model=hybrid_1p5m", "tokens=30M", "precision=nvfp4", runs=tmp_path) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "no finished runs of small_sweep" in err and "python -m nvfp4train.reproduce run small_sweep" in err


@pytest.mark.parametrize(
    "words, message",
    [
        (["model=hybrid_1p5m", "tokens=30M", "precision=fp4"], "precision='fp4'; allowed: the arms of small_sweep"),
        (["model=../x", "tokens=30M", "precision=nvfp4"], "model='../x'; expected a preset"),
        (["model=1e6", "tokens=lots", "precision=nvfp4"], "tokens='lots'; expected a number"),
        (["model=1e6", "precision=nvfp4"], "tokens= missing"),
        (["size=1e6"], "'size=1e6'; expected model=..."),
    ],
)
def test_predict_bad_words_are_one_line(sweep, capsys, words, message):
    assert predict(sweep, *words) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_report_has_the_sweep_section_with_its_tables_law_slopes_and_figures(sweep, tmp_path):
    out = tmp_path / "out"
    assert (
        main(
            [
                "--experiments-dir",
                str(sweep / "experiments"),
                "report",
                "--runs-dir",
                str(sweep / "runs"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = (out / "reproduction.md").read_text()
    section = text.split("## Sweep small_sweep")[1]
    assert "36 of the 36 runs it plans are finished" in section
    assert "## Runs not compared" not in text  # a sweep's runs are its arms' runs
    assert "| hybrid_0p5m | 469K | 80 | 3 |" in section  # a cell's row: size, N, D/N, seeds
    assert "| alpha |" in section and "| c (nvfp4) |" in section
    assert "per decade of N, %" in section and "with size" in section
    assert "predict model=nemotron_h_12b tokens=10T precision=nvfp4" in section and "extrapolated" in section
    assert "### Evaluated in BF16 (" in section and "### Evaluated in the training precision (" in section
    assert (out / "reproduction" / "small_sweep_bf16.png").stat().st_size > 10_000
    assert (out / "reproduction" / "small_sweep_training.png").is_file()


def test_run_schedules_the_cells_smallest_first(sweep, tmp_path, capsys):
    args = ["--experiments-dir", str(sweep / "experiments"), "run", "small_sweep", "--dry-run", "--device", "cpu"]
    assert main([*args, "--runs-dir", str(tmp_path)]) == 0
    queued = [line.split()[-1] for line in capsys.readouterr().out.splitlines() if "queued" in line]
    cells = list(dict.fromkeys(k.split("/")[1].rsplit("-", 1)[0] for k in queued))
    assert cells == [  # by parameters x tokens
        "hybrid_0p5m-tpp5",
        "hybrid_0p5m-tpp20",
        "hybrid_1p5m-tpp5",
        "hybrid_0p5m-tpp80",
        "hybrid_1p5m-tpp20",
        "hybrid_3m-tpp20",
    ]
    first = [k for k in queued if "hybrid_0p5m-tpp5-" in k]
    assert [k.split("/")[-1] for k in first] == ["seed1", "seed1", "seed2", "seed2", "seed3", "seed3"]


# ------------------------------------------------------------------------------------ bad sweep keys
@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda s: s["sweep"].update(sizez=[]),
            "sweep: unknown key 'sizez'; allowed: sizes, tokens_per_param, min_lr_fraction",
        ),
        (lambda s: s["sweep"]["sizes"][0].update(width=3), "sweep.sizes[0]: unknown key 'width'; allowed: model, lr,"),
        (
            lambda s: s["sweep"]["sizes"][0].update(model="hybrid_7q"),
            "sweep.sizes[0].model='hybrid_7q'; allowed: the presets",
        ),
        (lambda s: s["sweep"]["sizes"][1].update(lr=0), "sweep.sizes[1].lr=0; expected the peak learning rate"),
        (
            lambda s: s["sweep"].update(tokens_per_param=[20, -1]),
            "sweep.tokens_per_param=[20, -1]; expected a non-empty list of numbers > 0",
        ),
        (
            lambda s: s["sweep"]["sizes"][2].update(arms=["nvfp4"]),
            "sweep.sizes[2].arms=['nvfp4'] lacks the baseline 'bf16'",
        ),
        (lambda s: s["sweep"]["sizes"][2].update(name="../up"), "sweep.sizes[2].name='../up' is not a plain name"),
        (lambda s: s["base"].append("model=hybrid_5m"), "base: 'model=hybrid_5m' beside sweep; each size sets model"),
        (
            lambda s: s["arms"].update(nvfp4={"overrides": ["precision=nvfp4"], "seeds": [1]}),
            "arms.nvfp4.seeds beside sweep",
        ),
        (lambda s: s.update(tokens=1000), "tokens=1000 beside sweep"),
    ],
)
def test_a_bad_sweep_key_is_one_line_naming_it(tmp_path, capsys, change, message):
    spec = yaml.safe_load(SWEEP)
    change(spec)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    before = path.read_bytes()
    with pytest.raises(UsageError, match=re.escape(message)):
        load_experiment("bad", tmp_path)
    assert main(["--experiments-dir", str(tmp_path), "plan", "bad"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert path.read_bytes() == before


def test_the_example_sweep_file_says_how_to_use_other_data_and_what_limits_it():
    text = textwrap.dedent((load_experiment("sweep_size").path).read_text())
    assert "tuned on BF16 only" in text and "Hugging Face" in text and "passes" in text


def test_a_learning_rate_yaml_reads_as_text_is_taken_as_the_number(tmp_path):
    (tmp_path / "s.yaml").write_text(SWEEP.replace("lr: 3.0e-3", "lr: 3e-3"))  # YAML 1.1: 3e-3 is a string
    exp = load_experiment("s", tmp_path)
    assert exp.sweep.sizes[0].lr == 0.003
    assert "optim.lr=0.003" in exp.arms["hybrid_0p5m-tpp5-bf16"].overrides


# ----------------------------------------------------------------------------- a size borrowed
LENDER = {
    "description": "the runs a sweep borrows: hybrid_3m at its lr, 20 tokens per parameter",
    "seeds": [1, 2, 3, 4],
    "baseline": "bf16",
    "base": [
        "model=hybrid_3m",
        "data=bundled",
        "train.seq_len=64",
        "train.global_batch_size=8",
        "optim.lr=1.7e-3",
        "optim.min_lr=1.7e-5",
    ],
    "eval": ["heldout_sequences=8", "eval_precision=both"],
    "arms": {"bf16": ["precision=bf16"], "nvfp4": ["precision=nvfp4"]},
}


@pytest.fixture(scope="module")
def cell_tokens(tmp_path_factory):
    """The tokens of the small sweep's hybrid_3m cell (20 per parameter, whole steps): the lender's budget."""
    directory = tmp_path_factory.mktemp("tokens")
    (directory / "small_sweep.yaml").write_text(SWEEP)
    exp = load_experiment("small_sweep", directory)
    return plan_experiment(exp, arms=["hybrid_3m-tpp20-bf16"], seeds=[1])[0].tokens


def borrowing(directory, tokens, change_sweep=None, change_lender=None):
    """An experiments dir: the small sweep whose hybrid_3m size (sweep.sizes[2]) borrows `lender`'s runs."""
    spec, lender = yaml.safe_load(SWEEP), json.loads(json.dumps(dict(LENDER, tokens=tokens)))
    spec["sweep"]["sizes"][2]["borrow"] = "lender"
    if change_sweep:
        change_sweep(spec)
    if change_lender:
        change_lender(lender)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "small_sweep.yaml").write_text(yaml.safe_dump(spec))
    (directory / "lender.yaml").write_text(yaml.safe_dump(lender))
    return directory


def test_a_borrowed_size_is_planned_with_the_lenders_out_dirs_and_run_only_by_it(tmp_path, cell_tokens, capsys):
    experiments = borrowing(tmp_path / "experiments", cell_tokens)
    exp = load_experiment("small_sweep", experiments)
    assert exp.source("hybrid_3m-tpp20-nvfp4") == ("lender", "nvfp4")
    assert exp.source("hybrid_1p5m-tpp20-nvfp4") == ("small_sweep", "hybrid_1p5m-tpp20-nvfp4")
    runs = plan_experiment(exp, tmp_path / "runs")
    lent = {(r.arm, r.seed): r for r in plan_experiment(load_experiment("lender", experiments), tmp_path / "runs")}
    borrowed = [r for r in runs if r.source is not None]
    assert len(runs) == 36 and {r.arm for r in borrowed} == {"hybrid_3m-tpp20-bf16", "hybrid_3m-tpp20-nvfp4"}
    for run in borrowed:
        assert run.out_dir == tmp_path / "runs" / "lender" / run.source[1] / f"seed{run.seed}"
        assert run.train_overrides == lent[(run.source[1], run.seed)].train_overrides
    assert all(r.out_dir.parts[-3] == "small_sweep" for r in runs if r.source is None)

    args = ["--experiments-dir", str(experiments), "run", "--dry-run", "--device", "cpu", "--runs-dir", str(tmp_path)]
    assert main([*args[:3], "small_sweep", *args[3:]]) == 0
    out = capsys.readouterr().out
    queued = [line.split()[-1] for line in out.splitlines() if "queued" in line]
    assert len(queued) == 30 and not any("hybrid_3m" in k for k in queued)
    assert "skip small_sweep/hybrid_3m-tpp20-bf16/seed1: borrowed: lender/bf16/seed1" in out
    assert main([*args[:3], "small_sweep", "lender", *args[3:]]) == 0  # named together: each run once
    queued = [line.split()[-1] for line in capsys.readouterr().out.splitlines() if "queued" in line]
    assert len(queued) == len(set(queued)) == 38 and "lender/bf16/seed1" in queued
    slurm = ["--experiments-dir", str(experiments), "run", "small_sweep", "--executor", "slurm", "--dry-run"]
    assert main([*slurm, "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "job array of 30 task(s)" in capsys.readouterr().out
    assert "hybrid_3m" not in (tmp_path / "runs" / "small_sweep" / "slurm" / "runs.txt").read_text()

    assert main(["--experiments-dir", str(experiments), "plan", "small_sweep", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"hybrid_3m-tpp20 .* borrowed +bf16 x3, nvfp4 x3 \(the runs of lender\)", out)
    assert "  30 run(s): " in out and out.rstrip().endswith("30 run(s); 6 borrowed (6 of lender)")


def test_a_size_borrows_an_arm_its_lender_borrows_from_the_experiment_that_makes_it(tmp_path, cell_tokens):
    def lend_nvfp4_from_another(lender):
        del lender["arms"]["nvfp4"]
        lender["borrow"] = {"nvfp4": "maker"}

    experiments = borrowing(tmp_path, cell_tokens, change_lender=lend_nvfp4_from_another)
    maker = json.loads(json.dumps(dict(LENDER, tokens=cell_tokens, seeds=[1, 2, 3])))
    (tmp_path / "maker.yaml").write_text(yaml.safe_dump(maker))
    exp = load_experiment("small_sweep", experiments)
    assert exp.source("hybrid_3m-tpp20-nvfp4") == ("maker", "nvfp4")
    assert exp.source("hybrid_3m-tpp20-bf16") == ("lender", "bf16")
    run = plan_experiment(exp, tmp_path / "runs", arms=["hybrid_3m-tpp20-nvfp4"], seeds=[2])[0]
    assert run.out_dir == tmp_path / "runs" / "maker" / "nvfp4" / "seed2"


@pytest.mark.parametrize(
    "change_sweep, change_lender, message",
    [
        (
            lambda s: s["sweep"]["sizes"][2].update(borrow="nope"),
            None,
            "sweep.sizes[2].borrow='nope': no experiment ",
        ),
        (
            lambda s: s["sweep"]["sizes"][2].update(borrow="small_sweep"),
            None,
            "sweep.sizes[2].borrow='small_sweep': ",  # itself, a sweep: refused, no endless loading
        ),
        (
            None,
            lambda e: e["arms"].pop("nvfp4"),
            "sweep.sizes[2].borrow='lender': arm 'nvfp4' of the size is not an arm of lender (its arms, own and "
            "borrowed: bf16)",
        ),
        (
            lambda s: s["sweep"]["sizes"][2].update(seeds=[1, 2, 5]),
            None,
            "sweep.sizes[2].borrow='lender': seed 5 of the size is not among lender's seeds of bf16 (1, 2, 3, 4)",
        ),
        (
            lambda s: s["sweep"]["sizes"][2].update(tokens_per_param=[20, 80]),
            None,
            "sweep.sizes[2].borrow='lender': the cell at tokens_per_param 80 trains ",
        ),
        (
            None,
            lambda e: e["base"].__setitem__(4, "optim.lr=2e-3"),
            "sweep.sizes[2].borrow='lender': arm bf16 at tokens_per_param 20 would not be lender's bf16 runs: "
            "optim.lr is 0.0017 here, 0.002 there",
        ),
        (
            None,
            lambda e: e["arms"].update(nvfp4=["precision=nvfp4", "precision.sr=none"]),
            "arm nvfp4 at tokens_per_param 20 would not be lender's nvfp4 runs: precision.sr is ",
        ),
        (
            None,
            lambda e: e["base"].append("train.log_every=5"),
            "would not be lender's bf16 runs: train.log_every is ",
        ),
        (
            None,
            lambda e: e.update(eval=["heldout_sequences=16", "eval_precision=both"]),
            "would not be lender's bf16 runs: eval is ['heldout_sequences=8', 'eval_precision=both'] here, "
            "['heldout_sequences=16', 'eval_precision=both'] there",
        ),
    ],
)
def test_a_size_that_cannot_borrow_is_one_line_naming_the_file_and_key(
    tmp_path, cell_tokens, capsys, change_sweep, change_lender, message
):
    experiments = borrowing(tmp_path, cell_tokens, change_sweep, change_lender)
    with pytest.raises(UsageError, match=re.escape(message)):
        load_experiment("small_sweep", experiments)
    assert main(["--experiments-dir", str(experiments), "plan", "small_sweep"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert f"{experiments / 'small_sweep.yaml'}: sweep.sizes[2].borrow=" in err


def test_status_copy_results_and_the_report_read_a_borrowed_size_from_its_lender(tmp_path, cell_tokens, capsys):
    """The borrowed cell's runs are the lender's directories (the lender's seed 4, which the sweep does not
    take, made far worse so that taking it would show); status, copy-results and the fit read them there."""
    import shutil

    from nvfp4train.reproduce.report import load_runs
    from nvfp4train.reproduce.scaling import sweep_cells

    experiments, runs_dir = borrowing(tmp_path / "experiments", cell_tokens), tmp_path / "runs"
    exp = load_experiment("small_sweep", experiments)
    write_finished(exp, plan_experiment(exp, runs_dir), np.random.default_rng(0))
    for arm in ("bf16", "nvfp4"):
        seed4 = runs_dir / "lender" / arm / "seed4"
        shutil.copytree(runs_dir / "lender" / arm / "seed1", seed4)
        evaluation = json.loads((seed4 / "eval.json").read_text())
        evaluation["heldout_mean_loss"] += 5.0
        (seed4 / "eval.json").write_text(json.dumps(evaluation))
    assert not (runs_dir / "small_sweep" / "hybrid_3m-tpp20-bf16").exists()

    cells = {c.size: c for c in sweep_cells(exp, load_runs([runs_dir]))[0]}
    lent = json.loads((runs_dir / "lender" / "nvfp4" / "seed2" / "eval.json").read_text())
    assert set(cells["hybrid_3m"].losses["bf16"]) == {1, 2, 3}
    assert cells["hybrid_3m"].losses["nvfp4"][2] == lent["heldout_mean_loss"]

    base = ["--experiments-dir", str(experiments)]
    assert main([*base, "status", "small_sweep", "--runs-dir", str(runs_dir)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"small_sweep/hybrid_3m-tpp20-nvfp4/seed3 +done .* borrowed: lender/nvfp4/seed3", out)
    assert "6 borrowed done, 30 done" in out and re.search(r"hybrid_3m-tpp20 +bf16 3/3, nvfp4 3/3", out)

    results = tmp_path / "results"
    assert main([*base, "copy-results", "small_sweep", "--runs-dir", str(runs_dir), "--to", str(results)]) == 0
    assert f"small_sweep/hybrid_3m-tpp20-bf16/seed1: copied into {results / 'lender' / 'bf16' / 'seed1'}" in (
        capsys.readouterr().out
    )
    assert sorted(p.name for p in (results / "lender" / "nvfp4").iterdir()) == ["seed1", "seed2", "seed3"]
    assert not list(results.glob("small_sweep/hybrid_3m*"))

    out = tmp_path / "out"
    assert main([*base, "report", "--runs-dir", str(runs_dir), "--out", str(out), "--no-figures"]) == 0
    section = (out / "reproduction.md").read_text().split("## Sweep small_sweep")[1]
    assert "36 of the 36 runs it plans (6 of them lender's) are finished" in section
    assert "| hybrid_3m | 2.85M | 20 | 3 |" in section  # the cell's 3 seeds, not the lender's 4
    c = float(re.search(r"\| c \(nvfp4\) \| ([\d.]+)", section).group(1))
    assert 0.4 < c < 0.8  # drawn at 0.6: the borrowed cell's losses are the lender's, seeds 1-3


def test_a_runs_time_besides_its_steps_is_measured_from_finished_runs(tmp_path):
    """run_overhead: wall time minus max_steps x the median step time, the median over finished GPU runs
    (a CPU run, an unfinished one, or one on another GPU is not counted)."""
    import gzip

    from nvfp4train.reproduce.plan import run_overhead

    def write(name, wall, steps, step_time, state="done", gpu="NVIDIA H200"):
        d = tmp_path / "exp" / name / "seed1"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"state": state, "wall_s": wall, "max_steps": steps, "gpu": gpu}))
        with gzip.open(d / "metrics.jsonl.gz", "wt") as f:
            for step, t in enumerate([step_time, step_time, 9.0], 1):  # the median, not the slow first window
                f.write(json.dumps({"step": step * 10, "step_time_s": t}) + "\n")

    write("a", 130.0, 1000, 0.08)  # 50 s besides its steps
    write("b", 100.0, 1000, 0.03)  # 70 s
    write("c", 90.0, 1000, 0.03)  # 60 s
    write("cpu", 900.0, 1000, 0.5, gpu="cpu")
    write("cut", 10.0, 1000, 0.01, state="interrupted")
    write("other", 500.0, 1000, 0.01, gpu="NVIDIA H100 80GB HBM3")
    assert run_overhead(tmp_path, gpu="H200") == pytest.approx((60.0, 3))
    assert run_overhead(tmp_path)[1] == 4
    assert run_overhead(tmp_path / "none") is None
