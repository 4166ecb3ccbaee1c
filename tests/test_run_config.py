"""RunConfig holds typed sections (ModelConfig, PrecisionPolicy, DataConfig, OptimConfig, TrainConfig), parsed
once, and one record of them (`to_dict`): the plain data that config.yaml, a checkpoint's meta.json and W&B keep,
which is the composed config itself for every preset, and which the runs committed under docs/results still
give back."""

import dataclasses
import itertools
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nvfp4train.config import ConfigError, RunConfig, compose, from_node, group_options
from nvfp4train.config.composition import resolved
from nvfp4train.config.schema import parse
from nvfp4train.data.config import DataConfig, parse_data_config
from nvfp4train.model.config import ModelConfig
from nvfp4train.optim import OptimConfig
from nvfp4train.precision.recipe import PrecisionPolicy, recorded_precision, recorded_run_config
from nvfp4train.train import resume_policy
from nvfp4train.train.rundir import RESOLVED

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("model", "precision", "data")
# configs/data/own.yaml leaves its files open (`???`); any names do, nothing is read
OPEN_KEYS = {"own": ["data.sources.own.train=mine.jsonl", "data.sources.own.val=held.jsonl"]}
COMMITTED = sorted(ROOT.glob("docs/results/runs/*/*/seed1/config.yaml"))


def _same(a, b) -> bool:
    """Equal as a YAML file would be: the same types (1 is not 1.0), keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _composed(overrides: list[str]) -> dict:
    """What config.yaml recorded before the sections were typed: the composed config, resolved."""
    raw = resolved(compose("train", overrides))
    raw.pop("hydra", None)
    return raw


@pytest.fixture(scope="module")
def presets() -> dict[str, dict[str, dict]]:
    """Every option of every config group: its section as the composed config holds it."""
    return {
        group: {name: _composed([f"{group}={name}", *OPEN_KEYS.get(name, [])])[group] for name in group_options(group)}
        for group in GROUPS
    }


def test_every_preset_combination_records_the_composed_config(presets):
    base = _composed([])
    combinations = list(itertools.product(*(presets[g].items() for g in GROUPS)))
    assert len(combinations) == len(group_options("model")) * len(group_options("precision")) * 5
    for choice in combinations:
        expected = {**base, **{g: section for g, (_, section) in zip(GROUPS, choice)}}
        cfg = parse(RunConfig, expected, "")
        assert isinstance(cfg.model, ModelConfig) and isinstance(cfg.precision, PrecisionPolicy)
        assert isinstance(cfg.data, DataConfig)
        record = cfg.to_dict()
        assert _same(record, expected), [name for _, (name, _) in zip(GROUPS, choice)]
    assert OmegaConf.to_yaml(record) == OmegaConf.to_yaml(expected)  # config.yaml's bytes, as _same implies


def test_a_group_section_does_not_depend_on_the_other_groups(presets):
    """The product above joins sections composed one group at a time: composed together, each preset's section
    is the same (no interpolation across sections), so the product is what a run's composition gives."""
    options = {g: list(presets[g]) for g in GROUPS}
    for i in range(max(len(v) for v in options.values())):
        choice = {g: options[g][i % len(options[g])] for g in GROUPS}
        node = compose("train", [f"{g}={n}" for g, n in choice.items()] + OPEN_KEYS.get(choice["data"], []))
        record = from_node("train", node).to_dict()
        for g, name in choice.items():
            assert _same(record[g], presets[g][name]), (g, name)


def test_sections_are_parsed_once_and_kept_through_replace():
    cfg = from_node("train", compose("train", ["model=hybrid_5m", "precision=nvfp4", "data=bundled"]))
    assert cfg.model.name == "hybrid_5m" and cfg.precision.name == "nvfp4" and cfg.precision.format == "nvfp4"
    assert [float(p.start) for p in cfg.data.phases] == [0.0, 0.7, 0.9]
    assert parse_data_config(cfg.data) is cfg.data  # the data room takes the parsed section as it is
    other = dataclasses.replace(cfg, seed=7)
    assert other.model is cfg.model and other.precision is cfg.precision and other.data is cfg.data
    assert cfg.model_config is cfg.model and cfg.policy is cfg.precision  # the aliases


def test_sections_given_as_mappings_or_dataclasses_are_the_same_config(presets):
    sections = {g: presets[g][name] for g, name in zip(GROUPS, ("hybrid_tiny", "nvfp4", "bundled"))}
    from_dicts = RunConfig(**sections)
    typed = RunConfig(
        model=ModelConfig.from_dict(sections["model"]),
        precision=PrecisionPolicy.from_dict(sections["precision"]),
        data=parse_data_config(sections["data"]),
        optim=OptimConfig(),
    )
    assert from_dicts == typed and from_dicts.to_dict() == typed.to_dict()


@pytest.mark.parametrize(
    "section, value, message",
    [
        ("model", {"d_modle": 64}, r"^model: unknown key 'd_modle' \(model.d_modle\); allowed: name, pattern,"),
        ("precision", {"format": "fp5"}, r"^precision.format='fp5': allowed bf16,"),
        ("data", {"tokenizer": "bpe8k", "sources": {}}, r"^data.sources must be a non-empty mapping"),
        ("model", 5, r"^model: must be a mapping of keys to values, got 5 \(int\)$"),
    ],
)
def test_a_bad_section_is_one_line_naming_its_key(presets, section, value, message):
    sections = {g: presets[g][name] for g, name in zip(GROUPS, ("hybrid_tiny", "bf16", "bundled"))}
    with pytest.raises(ConfigError, match=message):
        RunConfig(**{**sections, section: value})


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: "/".join(p.parts[-4:-2]))
def test_a_committed_runs_config_yaml_still_loads_and_resumes(path):
    """A resume compares the saved config with today's record: a committed run's config.yaml still parses as a
    RunConfig, gives back its model, data and optimizer sections as recorded, and the precision keys it
    recorded (in today's names); a resume would note only the keys added since."""
    saved = OmegaConf.to_container(OmegaConf.load(path))
    saved.pop(RESOLVED, None)  # the plan's decisions, which later runs record beside the config
    cfg = parse(RunConfig, recorded_run_config(saved), "")
    record = cfg.to_dict()
    for key in ("model", "data", "optim", "out_dir", "seed", "experiment"):
        assert _same(record[key], saved[key]), key
    precision = recorded_precision(saved["precision"])
    assert {k: record["precision"][k] for k in precision} == precision
    translated = recorded_run_config(saved)
    for note in resume_policy.check(saved, record, path.parent / "checkpoints"):
        section, _, key = note.split()[2].rstrip(":").partition(".")  # "resume changes SECTION.KEY: ..."
        assert key.split(".")[0] not in translated[section], note
