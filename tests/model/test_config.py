from pathlib import Path

import pytest
import yaml

from nvfp4train.model import ModelConfig, build_model
from nvfp4train.model.config import BLOCK_KINDS

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
FIELDS = [f for f in ModelConfig.__dataclass_fields__]


def test_all_presets_present():
    assert set(PRESETS) >= {
        "hybrid_tiny",
        "hybrid_50m",
        "hybrid_125m",
        "hybrid_350m",
        "hybrid_1b",
        "nemotron_h_12b",
        "nemotron_h_8b",
        "transformer_1p2b",
    }


@pytest.mark.parametrize("name", PRESETS)
def test_preset_yaml_has_exactly_the_config_keys(name):
    d = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    assert list(d) == FIELDS
    cfg = ModelConfig.from_dict(d)
    assert cfg.name == name


def test_dataclass_defaults_are_hybrid_tiny():
    d = yaml.safe_load((CONFIG_DIR / "hybrid_tiny.yaml").read_text())
    assert ModelConfig.from_dict(d) == ModelConfig()
    cfg = ModelConfig()
    assert set(cfg.pattern) == set(BLOCK_KINDS) and cfg.vocab_size == 8192


@pytest.mark.parametrize(
    "override, words",
    [
        ({"n_layers": 4}, ["unknown key 'n_layers'", "pattern", "d_model"]),
        ({"pattern": "M-X"}, ["model.pattern", "'X'", "position 2"]),
        ({"pattern": ""}, ["model.pattern", "non-empty"]),
        ({"n_heads": 6, "n_kv_heads": 4}, ["model.n_kv_heads", "n_heads=6"]),
        ({"mamba_head_dim": 48}, ["model.mamba_head_dim", "d_inner"]),
        ({"mamba_groups": 3}, ["model.mamba_groups"]),
        ({"d_model": "128"}, ["model.d_model", "expected int"]),
        ({"d_model": True}, ["model.d_model", "expected int"]),
        ({"rope": 1}, ["model.rope", "expected bool"]),
        ({"ssd_backend": "cuda"}, ["model.ssd_backend", "auto, torch, triton"]),
        ({"d_model": 0}, ["model.d_model", "positive"]),
        ({"rope": True, "head_dim": 7}, ["model.head_dim", "even"]),
    ],
)
def test_bad_config_raises_one_line_error_naming_the_key(override, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_dict({**ModelConfig().to_dict(), **override})
    message = str(e.value)
    assert "\n" not in message
    for w in words:
        assert w in message


def test_attention_constraints_ignored_without_attention_blocks():
    # A pure Mamba/MLP pattern does not care whether the attention head counts divide.
    cfg = ModelConfig.from_dict({"pattern": "M-", "n_heads": 3, "n_kv_heads": 2})
    assert cfg.count("*") == 0


def test_float_fields_accept_yaml_exponent_strings():
    # PyYAML parses "1e-5" (no dot) as a string; that is still a valid float.
    assert ModelConfig.from_dict({"norm_eps": "1e-6"}).norm_eps == 1e-6
    with pytest.raises(ValueError, match="model.norm_eps: expected float"):
        ModelConfig.from_dict({"norm_eps": "small"})


def test_build_model_rejects_bad_dict():
    with pytest.raises(ValueError, match="unknown key 'dmodel'"):
        build_model({"dmodel": 64})


def test_derived_sizes_match_megatron_12b():
    d = yaml.safe_load((CONFIG_DIR / "nemotron_h_12b.yaml").read_text())
    cfg = ModelConfig.from_dict(d)
    assert cfg.mamba_d_inner == 10240 and cfg.mamba_heads == 128
    assert cfg.mamba_in_proj_dim == 22656  # z, x: 2*10240; B, C: 2*8*128; dt: 128 heads (Mamba2Mixer)
    assert (cfg.count("M"), cfg.count("*"), cfg.count("-")) == (28, 6, 28)
