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
