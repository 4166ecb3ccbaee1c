"""`reproduce tune-lr SWEEP`: the BF16 learning-rate scan of a sweep's sizes (the example's plan, borrowed size
skipped; refusals in one line) and its table from run directories written as the executor writes them (the
lowest mean over seeds picked, an optimum at an end of the grid flagged, the lines to write into the file)."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import yaml

from nvfp4train.reproduce.__main__ import main
from nvfp4train.reproduce.experiments import load_experiment
from nvfp4train.reproduce.plan import plan_experiment
from nvfp4train.reproduce.tune_lr import lr_scan
from tests.reproduce.test_sweep import SWEEP, write_finished

pytestmark = pytest.mark.unit


def commands(out: str) -> dict[str, str]:
    """A dry run's training commands by run key."""
    lines = out.splitlines()
    return {
        line.split()[1]: lines[i + 1]
        for i, line in enumerate(lines)
        if line.startswith("# ") and lines[i + 1].startswith("python -m nvfp4train.train ")
    }


def test_dry_run_of_the_example_plans_sizes_by_factors_in_bf16_and_leaves_the_borrowed_size(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    assert main(["tune-lr", "sweep_size", "--dry-run", "--device", "cpu", "--runs-dir", str(runs_dir)]) == 0
    out = capsys.readouterr().out
    planned = commands(out)
    queued = re.findall(r"queued \d+: (\S+)", out)
    assert len(planned) == len(queued) == 15 and set(queued) == set(planned)  # 3 sizes x 5 factors x seed 1
    assert "hybrid_5m: borrowed from b_fp8_vs_nvfp4, keeps its lender's lr 0.0015; not scanned" in out
    assert not any("hybrid_5m" in key for key in queued)
    for model, lr in (("hybrid_0p5m", 3e-3), ("hybrid_1p5m", 2.1e-3), ("hybrid_3m", 1.7e-3)):
        for factor in (0.5, 0.707, 1, 1.414, 2):
            scanned = float(f"{lr * factor:g}")
            key = f"sweep_size_lr/{model}-lr{scanned:g}-tpp20-bf16/seed1"
            words = planned[key].split()
            assert f"model={model}" in words and "precision=bf16" in words and "seed=1" in words
            assert f"optim.lr={scanned:g}" in words and f"optim.min_lr={scanned * 0.01:g}" in words
            assert f"out_dir={runs_dir / key}" in words
    assert "dry run: nothing started" in out and not runs_dir.exists()

    # the scan's run at factor 1 is the sweep's own BF16 run at 20 tokens per parameter but for its names
    sweep = load_experiment("sweep_size")
    own = plan_experiment(sweep, runs_dir, ["hybrid_1p5m-tpp20-bf16"], [1], "cpu")[0]
    ours = planned["sweep_size_lr/hybrid_1p5m-lr0.0021-tpp20-bf16/seed1"].split()[3:]
    drop = ("experiment=", "out_dir=")
    assert [w for w in ours if not w.startswith(drop)] == [w for w in own.train_overrides if not w.startswith(drop)]


def test_seeds_and_a_budget_a_size_does_not_run(tmp_path):
    (tmp_path / "small_sweep.yaml").write_text(SWEEP)
    scan = lr_scan(load_experiment("small_sweep", tmp_path), (0.5, 2.0), (1, 2), tokens_per_param=80)
    runs = plan_experiment(scan.exp, tmp_path / "runs")
    assert len(runs) == 3 * 2 * 2 and {r.seed for r in runs} == {1, 2}
    assert {scan.exp.arms[r.arm].tokens_per_param for r in runs} == {80.0}
    # hybrid_0p5m runs 80; the other two do not: said, and scanned there anyway
    assert [n.split(":")[0] for n in scan.notes] == ["hybrid_1p5m", "hybrid_3m"]
    assert (
        "scanned at 80 tokens per parameter, which the sweep does not run at this size (it runs 5, 20)"
        in (scan.notes[0])
    )
    default = lr_scan(load_experiment("small_sweep", tmp_path))
    assert default.tokens_per_param == {"hybrid_0p5m": 20.0, "hybrid_1p5m": 20.0, "hybrid_3m": 20.0}
    assert not default.notes


@pytest.mark.parametrize(
    "words, change, message",
    [
        (["--factors", "0.5,0,2"], None, "--factors 0.5,0,2: '0' is not a number > 0"),
        (["--factors", "0.5,-1"], None, "--factors 0.5,-1: '-1' is not a number > 0"),
        (["--factors", "0.5,x"], None, "--factors 0.5,x: 'x' is not a number > 0"),
        (["--factors", "1,0.5,1.0"], None, "--factors 1,0.5,1.0: 1 is listed twice"),
        (["--factors", "1,1000"], None, "--factors: 1000 x "),
        (["--seeds", "1,1"], None, "--seeds 1,1: a seed is listed twice"),
        (["--tokens-per-param", "0"], None, "--tokens-per-param 0: expected a number > 0"),
        (
            [],
            lambda s: s.pop("sweep") and s.update(tokens=1000, base=[*s["base"], "model=hybrid_0p5m"]),
            "no sweep key",
        ),
        (
            [],
            lambda s: s["arms"].update(bf16=["precision=nvfp4"]),
            "small_sweep.yaml: arms.bf16: the baseline arm 'bf16' selects precision=nvfp4; tune-lr tunes the lr on "
            "BF16 only",
        ),
        (
            [],
            lambda s: s["arms"].update(bf16=[]) or s["base"].append("precision=mxfp4"),
            "small_sweep.yaml: base: the baseline arm 'bf16' selects precision=mxfp4",
        ),
    ],
)
def test_a_bad_scan_is_refused_in_one_line(tmp_path, capsys, words, change, message):
    spec = yaml.safe_load(SWEEP)
    if change:
        change(spec)
    (tmp_path / "small_sweep.yaml").write_text(yaml.safe_dump(spec))
    before = (tmp_path / "small_sweep.yaml").read_bytes()
    args = ["--experiments-dir", str(tmp_path), "tune-lr", "small_sweep", "--dry-run", "--device", "cpu"]
    assert main([*args, "--runs-dir", str(tmp_path / "runs"), *words]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert message in captured.err and "Traceback" not in captured.err
    assert (tmp_path / "small_sweep.yaml").read_bytes() == before and not (tmp_path / "runs").exists()


def test_a_non_sweep_experiment_of_the_repository_is_refused(capsys):
    assert main(["tune-lr", "b_fp8_vs_nvfp4", "--report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b_fp8_vs_nvfp4.yaml: no sweep key" in err


# ------------------------------------------------------------------------------------- the table
def curve(size: str, factor: float, seed: int) -> float:
    """The BF16 held-out loss the synthetic runs end at: hybrid_0p5m best at 1.414 by the mean of its seeds
    (seed 1 alone best at 1: a seed's number alone would pick wrong), hybrid_1p5m still falling at 2 (the
    grid's top), hybrid_3m rising from 0.5 (its bottom)."""
    x = math.log2(factor)
    if size == "hybrid_0p5m":
        loss = 3.0 + 0.05 * (x - 0.5) ** 2
        if factor == 1:
            loss += -0.02 if seed == 1 else 0.03
        return loss
    if size == "hybrid_1p5m":
        return 2.9 - 0.01 * x + 0.001 * seed
    return 2.8 + 0.01 * x + 0.001 * seed


def set_loss(run_dir, loss: float) -> None:
    evaluation = json.loads((run_dir / "eval.json").read_text())
    evaluation["heldout_mean_loss"] = loss
    evaluation["heldout"] = {"text": {"loss": loss, "tokens": 512}}
    (run_dir / "eval.json").write_text(json.dumps(evaluation))


def rows(out: str, size: str) -> dict[str, list[str]]:
    """One size's table: lr -> the words of its row."""
    block = out.split(f"\n{size} (sweep.sizes[")[1].split("\n\n")[0].split("\n")
    return {line.split()[1]: line.split() for line in block if re.match(r"  +[\d.]+ +[\d.e-]+ +\d+/\d+ ", line)}


def test_the_table_picks_the_lowest_mean_flags_an_edge_and_prints_the_lines_for_the_file(tmp_path, capsys):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "small_sweep.yaml").write_text(SWEEP)
    exp = load_experiment("small_sweep", tmp_path / "experiments")
    runs_dir = tmp_path / "runs"
    scan = lr_scan(exp, seeds=(1, 2))
    runs = plan_experiment(scan.exp, runs_dir)
    write_finished(scan.exp, runs, np.random.default_rng(0))
    factor_of = {p.arm: p for p in scan.points}
    for run in runs:
        point = factor_of[run.arm]
        set_loss(run.out_dir, curve(point.size.name, point.factor, run.seed))
    unfinished = runs_dir / "small_sweep_lr" / "hybrid_3m-lr0.0034-tpp20-bf16" / "seed2"
    shutil.rmtree(unfinished)  # one lr of hybrid_3m with 1 of its 2 seeds

    base = ["--experiments-dir", str(tmp_path / "experiments"), "tune-lr", "small_sweep", "--seeds", "1,2"]
    assert main([*base, "--report", "--runs-dir", str(runs_dir)]) == 0
    out = capsys.readouterr().out
    assert "queued" not in out and "dry run" not in out and not unfinished.exists()  # --report starts nothing

    small = rows(out, "hybrid_0p5m")
    assert list(small) == ["0.0015", "0.002121", "0.003", "0.004242", "0.006"]
    assert small["0.004242"][-2:] == ["<-", "best"] and sum("best" in r for r in small.values()) == 1
    assert small["0.003"][2] == "2/2" and small["0.003"][4:8] == [
        "1:",
        "2.99250",
        "2:",
        "3.04250",
    ]  # seed 1 the lowest of all
    assert float(small["0.003"][3]) == pytest.approx((2.9925 + 3.0425) / 2, abs=1e-5)
    assert "hybrid_0p5m: the best lr" not in out  # inside the grid: no factor to add

    middle = rows(out, "hybrid_1p5m")
    assert middle["0.004"][-1] == "best"
    assert (
        "hybrid_1p5m: the best lr is at the grid's highest factor (2): the optimum may lie above it; add factor "
        "2.83 (--factors 0.5,0.707,1,1.414,2,2.83)" in out
    )
    large = rows(out, "hybrid_3m")
    assert large["0.00085"][-1] == "best" and large["0.0034"][2] == "1/2"
    assert "the means are over different numbers of seeds" in out.split("\nhybrid_3m (")[1]
    assert (
        "hybrid_3m: the best lr is at the grid's lowest factor (0.5): the optimum may lie below it; add factor 0.354"
        in out
    )

    lines = out.split("tune-lr leaves the file as it is):\n")[1]
    assert f"The lr to write into {exp.path} (sweep.sizes[]" in out
    entries = yaml.safe_load(re.sub(r"  # .*", "", lines))
    assert entries == [
        {"model": "hybrid_0p5m", "lr": 0.004242},
        {"model": "hybrid_1p5m", "lr": 0.004},
        {"model": "hybrid_3m", "lr": 0.00085},
    ]
    assert (tmp_path / "experiments" / "small_sweep.yaml").read_text() == SWEEP  # the file is left as it is

    # the report knows these runs for the scan's: not listed among runs no experiment compares
    from nvfp4train.reproduce.report import left_out_lines, load_runs

    assert left_out_lines(load_runs([runs_dir]), [exp]) == []


def test_the_report_of_a_scan_not_yet_run_says_so(tmp_path, capsys):
    assert main(["tune-lr", "sweep_size", "--report", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("no finished run of") == 3 and "  # hybrid_3m: no finished run yet" in out
    assert not list(tmp_path.iterdir())
