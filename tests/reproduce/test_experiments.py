"""The experiment files: every one loads; tiers A and B are what the campaign needs (seeds, tokens per
parameter, BF16 validation at every 5% on >= 64 sequences per source, one run per GPU at the trainer's
GPU defaults); hybrid_5m is ~5M non-embedding parameters in hybrid_repro's block mix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from nvfp4train.launch.processes import run_and_kill_on_timeout
from nvfp4train.reproduce.experiments import EXPERIMENTS_DIR, UsageError, all_experiments, load_experiment
from nvfp4train.reproduce.plan import model_params, plan_experiment
from tests.conftest import REPO, cli_env


def test_every_experiment_loads_and_borrows_from_its_own_tier():
    experiments = {e.name: e for e in all_experiments()}
    assert {
        "a_fp8_vs_nvfp4",
        "a_nvfp4_ablations",
        "a_mxfp4",
        "a_bf16_switch",
        "b_fp8_vs_nvfp4",
        "b_mxfp4",
        "b_bf16_switch",
    } <= set(experiments)
    for exp in experiments.values():
        for arm, source in exp.borrow.items():
            assert experiments[source].tier == exp.tier and arm in experiments[source].arms, (exp.name, arm)
            assert experiments[source].tokens == exp.tokens


def test_tiers_as_the_campaign_plans_them():
    seeds = {
        name: {a: len(arm.seeds) for a, arm in load_experiment(name).arms.items()}
        for name in (
            "a_fp8_vs_nvfp4",
            "a_nvfp4_ablations",
            "a_mxfp4",
            "a_bf16_switch",
            "b_fp8_vs_nvfp4",
            "b_mxfp4",
            "b_bf16_switch",
        )
    }
    assert set(seeds["a_fp8_vs_nvfp4"].values()) == {6} and seeds["a_nvfp4_ablations"]["rht_everywhere"] == 3
    assert {a: n for a, n in seeds["a_nvfp4_ablations"].items() if a != "rht_everywhere"} == dict.fromkeys(
        ("no_sr", "no_rht", "no_2d", "all_layers"), 6
    )
    assert set(seeds["a_mxfp4"].values()) == set(seeds["a_bf16_switch"].values()) == {6}
    assert set(seeds["a_bf16_switch"]) == {"switch_full", "switch_forward", "switch_backward"}
    assert all(set(seeds[f"b_{n}"].values()) == {5} for n in ("fp8_vs_nvfp4", "mxfp4", "bf16_switch"))
    for name, per_param in (("a_fp8_vs_nvfp4", 1.75), ("b_fp8_vs_nvfp4", 20.0)):
        exp = load_experiment(name)
        run = plan_experiment(exp, seeds=[1])[0]
        _, non_embedding = model_params(run.info["model"])
        assert abs(run.tokens / non_embedding - per_param) < 0.05 * per_param, (name, run.tokens / non_embedding)
        overrides = dict(o.split("=", 1) for o in run.train_overrides)
        assert overrides["train.eval_precision"] == "both" and int(overrides["train.eval_sequences"]) >= 64
        assert "eval_precision=both" in run.eval_args
        assert abs(run.max_steps / int(overrides["train.eval_every"]) - 20) < 1  # every 5% of the tokens
        assert "train.compile" not in overrides and "train.cuda_graph" not in overrides  # the GPU defaults
        assert overrides["data"] == "repro30m" and "heldout_sequences=1000000" in run.eval_args


def test_hybrid_5m_size_and_block_mix():
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", "nvfp4train.summary", "model=hybrid_5m"],
        cwd=REPO,
        env=cli_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5 mamba, 1 attention, 6 mlp" in proc.stdout
    repro = yaml.safe_load((EXPERIMENTS_DIR.parent / "model" / "hybrid_repro.yaml").read_text())
    small = yaml.safe_load((EXPERIMENTS_DIR.parent / "model" / "hybrid_5m.yaml").read_text())
    assert small["pattern"] == repro["pattern"] and small["vocab_size"] == repro["vocab_size"]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("parameters:"))
    non_embedding = int(line.split("total, ")[1].split()[0].replace(",", ""))
    assert 4.5e6 <= non_embedding <= 5.5e6, line
    assert json.loads(proc.stdout.strip().splitlines()[-1])["params"] > non_embedding


def test_runs_come_seed_by_seed():
    """A campaign stopped part-way must leave whole seeds (every arm of a seed), which the paired
    comparison needs: the queue is seed-major, arms in the experiment's order within a seed."""
    exp = load_experiment("b_fp8_vs_nvfp4")
    runs = plan_experiment(exp, seeds=[2, 1])
    assert [(r.seed, r.arm) for r in runs] == [(s, a) for s in (1, 2) for a in exp.arms]


@pytest.mark.parametrize("arm", ["../../outside", "/tmp/abs", "a/b", "..", ".hidden"])
def test_an_arm_name_that_is_a_path_is_refused_when_the_file_is_read(tmp_path, arm):
    from nvfp4train.reproduce.experiments import UsageError

    spec = {"tokens": 100, "seeds": [1], "baseline": "a", "arms": {"a": [], arm: ["precision=nvfp4"]}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(UsageError, match=r"is not a plain name .* it names a directory of the runs"):
        load_experiment("exp", tmp_path)
    borrowed = {"tokens": 100, "seeds": [1], "baseline": "a", "arms": {"a": []}, "borrow": {"b": arm}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(borrowed))
    with pytest.raises(UsageError, match=r"borrow\.b: .* is not a plain name"):
        load_experiment("exp", tmp_path)


def _experiment(tmp_path, base: str) -> Path:
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "shared.yaml").write_text(
        f"tokens: 256\nseeds: [1]\nbaseline: bf16\nbase: {base}\n"
        "arms:\n  bf16: [precision=bf16, train.seq_len=32, train.global_batch_size=2]\n"
    )
    return experiments


def test_an_experiment_file_that_names_code_is_refused_by_plan_run_and_status(tmp_path):
    """Experiment files are shared between people: one whose overrides reach Hydra's callbacks (code Hydra
    instantiates) is refused when the file is read, so nothing runs; the marker the payload would write stays
    absent."""
    marker = tmp_path / "marker"
    callback = "+hydra.callbacks.x"
    payload = f"['{callback}._target_=builtins.open', '{callback}.file={marker}', '{callback}.mode=w']"
    experiments = _experiment(tmp_path, payload)
    runs = tmp_path / "runs"
    for verb in (["plan", "shared"], ["status", "shared"], ["run", "shared", "--executor", "local", "--device", "cpu"]):
        proc = run_and_kill_on_timeout(
            [
                sys.executable,
                "-m",
                "nvfp4train.reproduce",
                "--experiments-dir",
                str(experiments),
                *verb,
                "--runs-dir",
                str(runs),
            ],
            cwd=REPO,
            env=cli_env(),
            timeout=300,
        )
        assert proc.returncode == 2, (verb, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "shared.yaml: base: +hydra.callbacks.x._target_=builtins.open" in proc.stderr, proc.stderr
        assert "allowed: hydra.verbose" in proc.stderr
        assert not marker.exists() and not runs.exists()


def test_an_experiment_file_may_not_read_the_environment(tmp_path):
    experiments = _experiment(tmp_path, "['experiment=${oc.env:HF_TOKEN,none}']")
    with pytest.raises(UsageError, match=r"shared.yaml: base: experiment=.*the resolver 'oc.env' is not allowed"):
        load_experiment("shared", experiments)
