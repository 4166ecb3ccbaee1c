"""Policies: validation, presets, BF16 block selection, per-operand recipe resolution."""

import math
from pathlib import Path

import pytest
import yaml

from nvfp4train.precision import ROLES, PrecisionPolicy
from nvfp4train.precision.recipe import BACKWARD_ROLES, FORWARD_ROLES, RETIRED_BF16_KEYS, recorded_precision

from .helpers import ABLATION_CHANGES, PRESETS, load_preset


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_validates(name):
    policy = load_preset(name)
    assert policy.name == name
    recipe = policy.quantized_recipe()
    assert recipe.all_bf16 == (name == "bf16")


@pytest.mark.parametrize(
    "cfg, key, allowed",
    [
        ({"format": "nvfp5"}, "precision.format", "nvfp4"),
        ({"format": "nvfp4", "rht": "fprop"}, "precision.rht", "wgrad"),
        ({"format": "nvfp4", "sr": "weights"}, "precision.sr", "grads"),
        ({"format": "nvfp4", "weight_tile": "32x32"}, "weight_tile", "16x16"),
        ({"format": "mxfp4", "weight_tile": "16x16"}, "weight_tile", "1x32"),
        ({"backend": "cuda"}, "precision.backend", "scaled_mm"),
        ({"switch": {"at_fraction": 0.8, "mode": "fwd"}}, "switch.mode", "forward_only"),
        ({"switch": {"at_fraction": 1.5}}, "switch.at_fraction", "[0, 1]"),
        ({"bf16_last": -1}, "bf16_last", ">= 0"),
        ({"bf16_last": 1.5}, "bf16_last", "a fraction is in (0, 1)"),
        ({"bf16_first": "two"}, "bf16_first", "float"),
        ({"format": "nvfp4", "rht": "wgrad", "rht_dim": 12}, "rht_dim", "power of two"),
        ({"format": "fp8_blockwise", "sr": "grads"}, "precision.sr", "'none'"),
        ({"format": "fp8_tensorwise", "rht": "wgrad"}, "precision.rht", "'none'"),
        ({"mxfp4_scale_rule": "round"}, "mxfp4_scale_rule", "rceil"),
        ({"mxfp4_scale_rule": "ceil"}, "mxfp4_scale_rule", "floor"),  # rceil's former name: refused
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(cfg, key, allowed):
    with pytest.raises(ValueError) as err:
        PrecisionPolicy.from_dict(cfg)
    assert key in str(err.value) and allowed in str(err.value)


def test_unknown_keys_are_rejected():
    with pytest.raises(ValueError, match="unknown key.*'sr_mode'"):
        PrecisionPolicy.from_dict({"format": "nvfp4", "sr_mode": "grads"})
    # the four keys one knob per side replaced: refused as unknown, naming the ones that exist
    with pytest.raises(ValueError, match="unknown key.*'bf16_last_fraction'.*bf16_last"):
        PrecisionPolicy.from_dict({"bf16_last_fraction": 0.1})
    with pytest.raises(ValueError, match="switch: unknown"):
        PrecisionPolicy.from_dict({"switch": {"at": 0.5}})


def test_nvfp4_preset_keeps_the_papers_12b_blocks_and_about_15_percent_elsewhere():
    policy = load_preset("nvfp4")
    assert policy.bf16_block_counts(62) == (2, 8)  # paper 12B: first 2 + last 8 of 62
    for n in (8, 12, 24, 52, 62):
        first, last = policy.bf16_block_counts(n)
        assert 0.10 <= (first + last) / n <= 0.2, (n, first, last)
    bf16 = [i for i in range(62) if policy.is_bf16_block(i, 62)]
    assert bf16 == [0, 1] + list(range(54, 62))
    assert load_preset("nvfp4_all_layers").bf16_block_counts(62) == (0, 0)
    assert load_preset("fp8_blockwise").bf16_block_counts(62) == (1, 2)  # first block + last 2


@pytest.mark.parametrize(
    "value, blocks, saved",
    [(0, 0, 0), (0.0, 0, 0), (2, 2, 2), (2.0, 2, 2), (1, 1, 1), (0.13, 8, 0.13), (0.5, 31, 0.5), (99, 62, 99)],
)
def test_one_knob_per_side_takes_a_count_or_a_fraction(value, blocks, saved):
    """A whole number counts blocks (kept an int in the saved config), a number in (0, 1) is a fraction of
    the blocks, rounded half up; a count past the model's size keeps every block in BF16."""
    policy = PrecisionPolicy.from_dict({"format": "nvfp4", "bf16_first": value, "bf16_last": value})
    assert policy.bf16_block_counts(62) == (blocks, blocks)
    assert policy.to_dict()["bf16_last"] == saved and type(policy.to_dict()["bf16_last"]) is type(saved)
    assert PrecisionPolicy.from_dict(policy.to_dict()) == policy


RECORDS = sorted((Path(__file__).parents[2] / "docs" / "results").glob("**/config.yaml"))


def test_committed_run_records_read_as_todays_precision_config():
    """docs/results/**/config.yaml record what ran, with the two keys per side of the time; read through
    recorded_precision they are today's configs, keep every block count, and match today's preset of the
    same name (a comparison of old records with new runs groups them together)."""
    assert len(RECORDS) >= 10
    old_records = 0
    for path in RECORDS:
        saved = yaml.safe_load(path.read_text())["precision"]
        current = recorded_precision(saved)
        if "bf16_first_fraction" not in saved:  # recorded after the change: today's keys, read as they are
            assert current == saved and "bf16_first" in saved, path
            preset = load_preset(saved["name"]).to_dict()
            assert (saved["bf16_first"], saved["bf16_last"]) == (preset["bf16_first"], preset["bf16_last"]), path
            continue
        old_records += 1
        assert not set(current) & {k for keys in RETIRED_BF16_KEYS.values() for k in keys}, path
        policy = PrecisionPolicy.from_dict(current)
        for n in (8, 12, 62):

            def old_count(side):
                frac, count = saved[f"bf16_{side}_fraction"], saved[f"bf16_{side}_blocks"]
                return min(n, math.floor(frac * n + 0.5)) if frac else min(n, count)

            assert policy.bf16_block_counts(n) == (old_count("first"), old_count("last")), (path, n)
        preset = load_preset(saved["name"]).to_dict()
        assert (current["bf16_first"], current["bf16_last"]) == (preset["bf16_first"], preset["bf16_last"]), path
    assert old_records >= 10  # the records keep what they say
    assert recorded_precision({"format": "nvfp4", "bf16_last": 3}) == {"format": "nvfp4", "bf16_last": 3}


def test_paper_recipe_per_operand():
    r = load_preset("nvfp4").quantized_recipe()
    assert (r.fprop_x.tile, r.fprop_x.rounding, r.fprop_x.rht_dim) == ((1, 16), "rne", 0)
    assert (r.fprop_w.tile, r.fprop_w.rounding, r.fprop_w.rht_dim) == ((16, 16), "rne", 0)
    assert (r.dgrad_dy.tile, r.dgrad_dy.rounding, r.dgrad_dy.rht_dim) == ((1, 16), "sr", 0)
    assert r.dgrad_w == r.fprop_w and r.reuses_fprop_weight
    assert (r.wgrad_dy.tile, r.wgrad_dy.rounding, r.wgrad_dy.rht_dim) == ((1, 16), "sr", 16)
    assert (r.wgrad_x.tile, r.wgrad_x.rounding, r.wgrad_x.rht_dim) == ((1, 16), "rne", 16)
    m = load_preset("mxfp4").quantized_recipe()
    assert m.wgrad_x.tile == (1, 32) and m.wgrad_x.rht_dim == 32 and m.fprop_x.scale_mode == "rceil"
    t = load_preset("fp8_tensorwise").quantized_recipe()
    assert [getattr(t, role).format for role in ROLES] == [
        "fp8_e4m3",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_e4m3",
    ]
    b = load_preset("fp8_blockwise").quantized_recipe()
    assert b.fprop_w.tile == (128, 128) and b.fprop_x.tile == (1, 128) and b.wgrad_dy.tile == (1, 128)


@pytest.mark.parametrize("ablation, changed", ABLATION_CHANGES)
def test_each_toggle_changes_exactly_the_operand_specs_it_names(ablation, changed):
    base, other = load_preset("nvfp4").quantized_recipe(), load_preset(ablation).quantized_recipe()
    assert {role for role in ROLES if getattr(base, role) != getattr(other, role)} == changed


@pytest.mark.parametrize(
    "mode, bf16_roles",
    [("full", set(ROLES)), ("forward_only", set(FORWARD_ROLES)), ("backward_only", set(BACKWARD_ROLES))],
)
def test_switch_modes_turn_the_right_operands_to_bf16(mode, bf16_roles):
    policy = load_preset("nvfp4", switch={"at_fraction": 0.8, "mode": mode})
    assert not policy.switch_due(0.79) and policy.switch_due(0.8)
    before = policy.layer_recipe(5, 12, switched=False)
    after = policy.layer_recipe(5, 12, switched=True)
    assert not any(getattr(before, r).is_bf16 for r in ROLES)
    assert {r for r in ROLES if getattr(after, r).is_bf16} == bf16_roles
    assert policy.layer_recipe(11, 12, switched=False).all_bf16  # a BF16 (last) block


def test_from_dict_takes_an_omegaconf_node_and_round_trips():
    from pathlib import Path

    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[2] / "configs" / "precision" / "nvfp4.yaml"
    policy = PrecisionPolicy.from_dict(OmegaConf.load(path))
    assert policy == load_preset("nvfp4")
    assert PrecisionPolicy.from_dict(policy.to_dict()) == policy


def test_summary_names_blocks_operands_and_switch():
    text = load_preset("nvfp4", switch={"at_fraction": 0.82, "mode": "forward_only"}).summary(62)
    assert "first 2 + last 8 of 62" in text and "wgrad_dy=nvfp4 1x16 sr rht16" in text
    assert "switch forward_only to BF16 at 0.82" in text


def test_mxfp4_scale_rule_reaches_the_recipe():
    rceil = PrecisionPolicy.from_dict({"format": "mxfp4", "mxfp4_scale_rule": "rceil"}).quantized_recipe()
    assert rceil.fprop_x.scale_mode == "rceil"
    assert (
        PrecisionPolicy.from_dict({"format": "mxfp4", "mxfp4_scale_rule": "floor"})
        .quantized_recipe()
        .fprop_x.scale_mode
        == "floor"
    )


def test_four_over_six_scopes_follow_te_and_ours():
    """TE's scopes (weights; activations/all need rht none), ours (*_fprop: wgrad_x keeps its RHT), never
    gradients; the scale bound and error mode reach the operands."""
    r = load_preset("nvfp4", four_over_six="weights").quantized_recipe()
    assert (r.fprop_w.four_over_six, r.fprop_w.scale_bound, r.dgrad_w.four_over_six) == ("mae", 256, "mae")
    assert not r.fprop_x.four_over_six and not r.dgrad_dy.four_over_six and not r.wgrad_dy.four_over_six
    r = load_preset("nvfp4", four_over_six="all", rht="none", four_over_six_err_mode="mse").quantized_recipe()
    assert {role for role in ROLES if getattr(r, role).four_over_six == "mse"} == {
        "fprop_x",
        "fprop_w",
        "dgrad_w",
        "wgrad_x",
    }
    r = load_preset("nvfp4", four_over_six="activations_fprop", four_over_six_scale_bound=448).quantized_recipe()
    assert (r.fprop_x.four_over_six, r.fprop_x.scale_bound) == ("mae", 448)
    assert not r.wgrad_x.four_over_six and r.wgrad_x.rht_dim == 16
    assert not r.reuses_fprop_weight or not r.fprop_w.four_over_six


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"four_over_six": "activations"}, "precision.four_over_six='activations' needs rht='none'"),
        ({"four_over_six": "weights", "rht": "all"}, "is not allowed with rht='all'"),
        ({"four_over_six": "weights", "sr": "all"}, "precision.four_over_six is not allowed with sr='all'"),
        ({"row_scaled_activation": True, "sr": "all"}, "precision.row_scaled_activation is not allowed with sr='all'"),
        ({"row_scaled_activation": True, "rht": "all"}, "precision.row_scaled_activation is not allowed with rht"),
        ({"four_over_six_scale_bound": 300}, "precision.four_over_six_scale_bound=300 is not allowed"),
        ({"four_over_six": "weights", "format": "mxfp4"}, "precision.four_over_six is an nvfp4 option"),
    ],
)
def test_te_option_combinations_neither_allows_are_refused_in_one_line(overrides, message):
    from nvfp4train.config.schema import ConfigError

    with pytest.raises(ConfigError) as info:
        load_preset("nvfp4", **overrides)
    assert message in str(info.value) and "\n" not in str(info.value)
