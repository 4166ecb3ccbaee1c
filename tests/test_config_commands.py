"""The one config mechanism (nvfp4train/config/): every Hydra-style command composes configs/<name>.yaml the
same way, checks it against its dataclass, answers bad input with one line naming the key, and has a --help
generated from the YAML and the dataclass."""

import dataclasses
import sys

import pytest
import yaml

from nvfp4train import config
from nvfp4train.config import COMMANDS, CONFIG_DIR, ConfigError, compose, load
from nvfp4train.config.schema import to_plain
from nvfp4train.launch.processes import run_and_kill_on_timeout
from nvfp4train.model.config import ModelConfig
from nvfp4train.precision.recipe import PrecisionPolicy
from tests.conftest import cli_env


def _main(name):
    if name == "eval":
        from nvfp4train.eval.__main__ import main
    elif name == "export":
        from nvfp4train.export import main
    elif name == "generate":
        from nvfp4train.generate import main
    else:
        from nvfp4train.summary import main
    return main


FLAT = ["eval", "export", "generate"]  # the commands whose YAML is a flat list of keys


@pytest.mark.parametrize("name", FLAT)
def test_yaml_and_dataclass_hold_the_same_keys_and_defaults(name):
    """The YAML a user reads and edits and the dataclass that checks it cannot drift apart."""
    in_yaml = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    assert in_yaml.pop("run_dir") == "???"
    schema = COMMANDS[name]
    fields = {f.name: f.default for f in dataclasses.fields(schema) if f.name != "run_dir"}
    assert in_yaml == {k: to_plain(v) for k, v in fields.items()}
    cfg = load(name, ["run_dir=runs/x"])
    assert isinstance(cfg, schema) and str(cfg.run_dir) == "runs/x"


@pytest.mark.parametrize("name", [*FLAT, "summary"])
def test_unknown_key_is_one_line_naming_it_and_the_allowed_ones(name, capsys):
    allowed = ", ".join(f.name for f in dataclasses.fields(COMMANDS[name]))
    assert _main(name)(["run_dir=r", "colour=red"] if name != "summary" else ["colour=red"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: unknown key 'colour'; allowed: {allowed}"


@pytest.mark.parametrize("name", FLAT)
def test_missing_run_dir_and_words_that_are_not_overrides(name, capsys):
    assert _main(name)([]) == 2
    assert capsys.readouterr().err.strip() == "error: run_dir: required, no default (e.g. run_dir=runs/default)"
    assert _main(name)(["runs/x"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: argument 'runs/x': expected key=value (see configs/{name}.yaml or --help)"
    )


@pytest.mark.parametrize(
    "name, arg, message",
    [
        ("eval", "device=tpu", "device='tpu': allowed auto, cpu, cuda"),
        ("eval", "batch_size=0", "batch_size=0: must be a positive integer"),
        ("eval", "step=-2", "step=-2: must be an integer >= 0"),
        ("eval", "max_items=many", "max_items: expected int, got 'many' (str)"),
        ("eval", "eval_precision=fp4", "eval_precision='fp4': allowed train, bf16, both"),
        ("export", "dtype=fp8", "dtype='fp8': allowed float32, bfloat16"),
        ("export", "overwrite=maybe", "overwrite: expected bool (true or false), got 'maybe' (str)"),
        ("generate", "top_k=-1", "top_k=-1: must be an integer >= 0"),
        ("generate", "temperature=nan", "temperature=nan: must be a finite number"),
        ("generate", "dtype=fp16", "dtype='fp16': allowed auto, float32, bfloat16"),
        ("generate", "model=hybrid_tiny", "unknown key 'model'; allowed: run_dir"),  # not a config group here
    ],
)
def test_bad_value_is_one_line_before_any_checkpoint_is_read(name, arg, message, capsys, tmp_path):
    # run_dir does not exist: the config is refused before anything looks at it
    assert _main(name)([f"run_dir={tmp_path / 'none'}", arg]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err, err


@pytest.mark.parametrize("name", [*FLAT, "summary"])
def test_help_lists_every_option_with_its_default(name):
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", f"nvfp4train.{name}", "--help"],
        env=cli_env(),
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = proc.stdout
    assert out.startswith(f"usage: python -m nvfp4train.{name} ")
    if name == "summary":
        assert "model=hybrid_tiny" in out and "nemotron_h_12b" in out and "train.seq_len=128" in out
        return
    for key in yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text()):
        assert f"\n  {key}=" in out, (key, out)
    assert "\n  run_dir=(required)  " in out and "\n  step=null  " in out
    assert {
        "eval": "\n  device=auto                auto | cpu | cuda",
        "export": "\n  dtype=float32              float32 | ",
        "generate": "\n  top_k=50                   sample among",
    }[name] in out


def test_summary_takes_model_group_fields_and_seq_len_alias():
    cfg = load("summary", ["model=nemotron_h_8b", "model.d_model=1024", "train.seq_len=512"])
    assert cfg.model.name == "nemotron_h_8b" and cfg.model.d_model == 1024 and cfg.train.seq_len == 512
    with pytest.raises(ConfigError, match=r"^train: unknown key 'max_steps' \(train.max_steps\); allowed: seq_len$"):
        load("summary", ["train.max_steps=3"])
    with pytest.raises(ConfigError, match=r"^unknown key 'precision'; allowed: model, train$"):
        load("summary", ["precision=fp8"])


def test_run_config_parses_its_model_and_precision_once():
    cfg = load("train", ["model=hybrid_5m", "precision=nvfp4"])
    assert isinstance(cfg.model, ModelConfig) and isinstance(cfg.precision, PrecisionPolicy)
    assert cfg.model_config is cfg.model and cfg.policy is cfg.precision  # the aliases
    assert cfg.model.name == "hybrid_5m" and cfg.precision.name == "nvfp4"


def test_train_overrides_use_the_same_checks():
    node = compose("train", ["train.max_steps=7"])
    assert node.train.max_steps == 7
    with pytest.raises(ConfigError, match=r"^train: unknown key 'max_stepz' \(train.max_stepz\); allowed: max_steps"):
        compose("train", ["train.max_stepz=7"])
    with pytest.raises(ConfigError, match=r"^reproduce=x: |^unknown key 'reproduce'"):
        compose("train", ["reproduce=x"])  # configs/reproduce/ is not a config group of a run
    with pytest.raises(ValueError, match="no config 'nope'"):
        config.load("nope")


def test_a_comma_list_is_text_outside_training():
    """docs/evaluation.md's `tasks=wiki_next_sentence,arithmetic`: no sweep outside training (Hydra would
    refuse it as ambiguous); training keeps Hydra's meaning (a sweep under -m)."""
    assert load("eval", ["run_dir=r", "tasks=wiki_next_sentence,arithmetic"]).tasks == "wiki_next_sentence,arithmetic"
    assert load("eval", ["run_dir=r", "tasks=[a,b]"]).tasks == ["a", "b"]
    with pytest.raises(ConfigError, match="Ambiguous value for argument 'seed=1,2'"):
        compose("train", ["seed=1,2"])
