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


@pytest.mark.parametrize(
    "text, value", [("12B", 12e9), ("1.2e10", 1.2e10), ("10T", 10e12), ("350m", 350e6), ("1_000", 1e3), ("x", None)]
)
def test_counts_read_as_a_user_writes_them(text, value):
    assert parse_count(text) == value


# ------------------------------------------------------------------------------ the example file
def test_plan_of_the_example_sweep_prints_the_grid_smallest_first_with_measured_or_unmeasured_hours(capsys):
    assert main(["plan", "sweep_size"]) == 0
    out = capsys.readouterr().out
    grid = [line.split() for line in out.splitlines() if re.match(r"  hybrid_\w+-tpp", line)]
    cells = [row[0] for row in grid]
    assert cells[0] == "hybrid_0p5m-tpp20" and cells[-1] == "hybrid_5m-tpp20" and len(cells) == 6
    rows = {row[0]: row for row in grid}
    assert rows["hybrid_0p5m-tpp20"][6] == "unmeasured"  # no benchmark of that preset: no number invented
    assert re.fullmatch(r"\d+\.\d\d", rows["hybrid_5m-tpp20"][6])  # hybrid_5m is benchmarked on an H100
    assert "mxfp4 x5" in " ".join(rows["hybrid_0p5m-tpp20"]) and "mxfp4" not in " ".join(rows["hybrid_5m-tpp20"])
    assert {rows[f"hybrid_1p5m-tpp{t}"][2] for t in (5, 20, 80)} == {"5", "20", "80"}
    assert "74 run(s)" in out
    # the cell's arms run its size's model and lr (BF16-tuned, the same for every arm)
    assert "model=hybrid_0p5m optim.lr=0.003 optim.min_lr=3e-05 precision=nvfp4" in out


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
    rng = np.random.default_rng(0)
    shared = {}
    for run in plan_experiment(exp, root / "runs"):
        size, tpp, arm = exp.arms[run.arm].cell
        n, t = run.info["params"], run.info["per_step"]
        shared.setdefault((size, tpp, run.seed), rng.normal(0, 0.01))
        loss = law(n, run.tokens, 0.6 if arm == "nvfp4" else 1.0) + shared[(size, tpp, run.seed)]
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
        info = {"state": "done", "experiment": exp.name, "arm": run.arm, "seed": run.seed, "max_steps": run.max_steps}
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
    return root


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
