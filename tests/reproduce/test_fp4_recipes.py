"""The matched-seed FP4 recipes experiment (b_fp4_recipes): every recipe on tier B's seeds, model, data and
schedule (the new recipes run here, the others borrowed from tier B's experiments with the same commands), and a
report row (a claim that applies) for each arm's paired gap to NVFP4."""

from nvfp4train.reproduce.claims import load_claims
from nvfp4train.reproduce.experiments import load_experiment
from nvfp4train.reproduce.plan import plan_experiment
from nvfp4train.reproduce.report import applies


def test_fp4_recipes_runs_every_recipe_on_tier_b_seeds_and_reports_each_against_nvfp4():
    exp, tier_b = load_experiment("b_fp4_recipes"), load_experiment("b_fp8_vs_nvfp4")
    assert exp.baseline == "nvfp4"
    assert exp.borrow == {"nvfp4": "b_fp8_vs_nvfp4", "mxfp4": "b_mxfp4", "switch_forward": "b_bf16_switch"}
    assert set(exp.arms) == {"nvfp4_4over6", "nvfp4_row_scaled"}
    assert {arm.seeds for arm in exp.arms.values()} == {tier_b.arms["nvfp4"].seeds} and len(exp.seeds) == 5
    assert exp.tokens == tier_b.tokens
    runs = plan_experiment(exp, seeds=[1])
    for name, lender in exp.borrow.items():
        runs += [r for r in plan_experiment(load_experiment(lender), seeds=[1]) if r.arm == name]
    by_arm = {run.arm: dict(o.split("=", 1) for o in run.train_overrides) for run in runs}
    ours = by_arm["nvfp4"]
    for arm, overrides in by_arm.items():  # the same run but for the precision
        assert {k: v for k, v in overrides.items() if not k.startswith(("precision", "out_dir", "experiment"))} == {
            k: v for k, v in ours.items() if not k.startswith(("precision", "out_dir", "experiment"))
        }, arm
    rows = {c.arm for c in load_claims() if applies(c, exp) and c.baseline == "nvfp4"}
    assert rows == set(exp.arms)  # the borrowed arms' rows are their own experiments' (b_mxfp4, b_bf16_switch)
    assert set(exp.compared_arms) == {"nvfp4", "nvfp4_4over6", "nvfp4_row_scaled", "mxfp4", "switch_forward"}


def _run_with_final_eval(template, to, bf16: float, tp: float) -> None:
    import json
    import shutil

    shutil.copytree(template, to)
    e = json.loads((to / "eval.json").read_text())
    sources = list(e["heldout"])
    e.update(
        eval_precision="both",
        heldout={s: {"loss": bf16, "ppl": 1.0, "tokens": 1} for s in sources},
        heldout_mean_loss=bf16,
        heldout_tp={s: {"loss": tp, "ppl": 1.0, "tokens": 1} for s in sources},
        heldout_tp_mean_loss=tp,
    )
    (to / "eval.json").write_text(json.dumps(e))


def test_the_report_puts_every_recipe_beside_nvfp4_with_its_paired_interval(tmp_path):
    """The harness's section lists each arm, borrowed or its own, against NVFP4 on the final evaluation in both
    precisions, paired by seed; an arm without paired runs has no row."""
    from nvfp4train.reproduce.report import load_runs, side_by_side_lines
    from tests.conftest import REPO

    template = REPO / "docs" / "results" / "runs" / "b_fp8_vs_nvfp4" / "nvfp4" / "seed1"
    exp = load_experiment("b_fp4_recipes")
    losses = {  # arm -> per seed (BF16, training precision)
        "nvfp4": {1: (2.50, 2.52), 2: (2.60, 2.62), 3: (2.55, 2.57)},
        "mxfp4": {1: (2.525, 2.55), 2: (2.626, 2.65)},
        "nvfp4_4over6": {1: (2.49, 2.51), 2: (2.60, 2.61), 3: (2.56, 2.57)},
    }
    for arm, seeds in losses.items():
        experiment, name = exp.source(arm)
        for seed, (bf16, tp) in seeds.items():
            _run_with_final_eval(template, tmp_path / experiment / name / f"seed{seed}", bf16, tp)
    runs = load_runs([tmp_path])
    text = "\n".join(side_by_side_lines(exp, runs))
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines() if " vs nvfp4" in line}
    assert set(rows) == {"mxfp4 vs nvfp4", "nvfp4_4over6 vs nvfp4"}  # switch_forward and row_scaled: no runs
    mx = rows["mxfp4 vs nvfp4"]
    assert mx[1] == "2"  # seeds 1 and 2 paired
    # BF16: +1.00% at both seeds; training precision: (2.55/2.52 - 1, 2.65/2.62 - 1) = +1.19%, +1.15%
    assert mx[2].startswith("+1.00%") and mx[3].startswith("+1.17% [")
    # mxfp4's own forward quantization: 2.55/2.525 - 1 = +0.99%, 2.65/2.626 - 1 = +0.91%
    assert mx[4].startswith("+0.95% [") and mx[4].endswith("(n=2) |")
    assert rows["nvfp4_4over6 vs nvfp4"][1] == "3"
