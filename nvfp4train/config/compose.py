"""Composing a command's config with Hydra: `compose(name, overrides)`, `load` (composed and checked against
COMMANDS[name]), the overrides checked before Hydra sees them, and the config groups' presets."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from nvfp4train.config.commands import COMMANDS, GROUPS, SummarySeqLen
from nvfp4train.config.run import SECTIONS, RunConfig
from nvfp4train.data.config import DataConfig, SourceConfig
from nvfp4train.schema import ConfigError, child_type, defaults, fields_of, parse, unknown_key


def _config_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # nvfp4train/
    shipped = package / "configs"  # a wheel's copy (setup.py); a source checkout has none
    return shipped if shipped.is_dir() else package.parent / "configs"


CONFIG_DIR = _config_dir()


def register_defaults() -> None:
    """The ConfigStore nodes the YAML files start from: `nvfp4train_defaults` (configs/train.yaml: every
    dataclass default of a run) and `nvfp4train_summary_defaults` (configs/summary.yaml: the model's, seq_len)."""
    from hydra.core.config_store import ConfigStore

    node = {name: defaults(schema) for name, schema in SECTIONS.items()}
    node.update({k: v for k, v in defaults(RunConfig).items() if k not in SECTIONS})
    node["out_dir"] = str(node["out_dir"])
    ConfigStore.instance().store(name="nvfp4train_defaults", node=node)
    summary = {"model": node["model"], "train": defaults(SummarySeqLen)}
    ConfigStore.instance().store(name="nvfp4train_summary_defaults", node=summary)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def command_schema(name: str):
    if name not in COMMANDS:
        raise ValueError(f"no config {name!r}; known: {', '.join(COMMANDS)}")  # a caller's bug, not input
    return COMMANDS[name]


def _check_key(schema, key: str) -> None:
    """`key` (dotted) must name a field of `schema`: the same message as for a key in a file."""
    node, path = schema, ""
    for part in key.split("."):
        if node is RunConfig:  # at the root the sections are checked against their own dataclasses
            allowed, inner = list(fields_of(RunConfig)), SECTIONS.get(part) or child_type(RunConfig, part)
        elif node is DataConfig and part == "sources":  # stored loosely: parse_data_config names each source
            allowed, inner = fields_of(node), dict[str, SourceConfig]
        else:
            allowed, inner = fields_of(node), child_type(node, part)
        if allowed is not None and part not in allowed:
            raise unknown_key(path, part, allowed)
        path = f"{path}.{part}" if path else part
        if inner is Any:
            return  # a free-form value (a list, a source spec): the dataclass checks it
        node = inner


def check_overrides(overrides: list[str], name: str = "train") -> None:
    """Check command-line overrides (`group=option`, `a.b=value`, sweeps `a=1,2`) against COMMANDS[name]."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    schema = command_schema(name)
    for arg in overrides:  # `~key` deletes a key, the one override without `=`
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            raise ConfigError(f"argument {arg!r}: expected key=value (see configs/{name}.yaml or --help)")
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(" ".join(str(e).split())) from None
    for o in parsed:
        key = o.key_or_group
        if o.is_delete() or key.split(".")[0] == "hydra":
            continue
        if key in GROUPS.get(name, ()):  # a config group: model, precision, data
            options = group_options(key)
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for value in values:
                if value not in options:
                    raise ConfigError(f"{key}={value}: no such {key} config; allowed: {', '.join(options)}")
        else:
            _check_key(schema, key)


def _explain(message: str) -> str:
    """Hydra's "Could not override 'data.sources.NAME...'" for a source the data config lacks: say how to
    train on one's own files instead of suggesting `+key`, which would add it to the bundled blend."""
    m = re.match(r"Could not override '(data\.sources\.([^.']+)[^']*)'", message)
    if m:
        return (
            f"{m.group(1)}: the data config has no source {m.group(2)!r}; to train on your own files: "
            "data=own data.sources.own.train=[a.jsonl,b.txt] data.sources.own.val=held.jsonl (docs/data.md)"
        )
    return message


def compose(name: str, overrides: list[str] = ()):
    """`configs/<name>.yaml` with the overrides (an OmegaConf node, `???` still open), as
    `python -m nvfp4train.<name> OVERRIDES` gets it; no Hydra output directory or log. The keys are checked;
    `load` (or `from_node`) checks the values."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(overrides, name)
    if name != "train":  # only training sweeps (`-m`): elsewhere `tasks=a,b` is the text "a,b", as documented
        overrides = [_comma_list_as_text(arg) for arg in overrides]
    register_defaults()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        try:
            return hydra_compose(name, overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(_explain(" ".join(str(e).split()))) from None


def _comma_list_as_text(arg: str) -> str:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    key, _, value = arg.partition("=")
    if "'" in value or OverridesParser.create().parse_override(arg).value_type != ValueType.SIMPLE_CHOICE_SWEEP:
        return arg
    return f"{key}='{value}'"


def check_complete(cfg) -> None:
    """A `???` left in a composed config (a run_dir, configs/data/own.yaml's files): one line naming it."""
    from omegaconf import OmegaConf

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        key = missing[0]
        example = (
            " (e.g. run_dir=runs/default)"
            if key == "run_dir"
            else f" (e.g. {key}=data/mine.jsonl; see docs/data.md)"
            if key.startswith("data.")
            else ""
        )
        raise ConfigError(f"{key}: required, no default{example}")


def from_node(name: str, cfg):
    """A composed config (an OmegaConf node) as the checked dataclass COMMANDS[name]."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_complete(cfg)
    try:
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:  # an interpolation that does not resolve: ${oc.env:UNSET}
        raise ConfigError(" ".join(str(e).split())) from None
    raw.pop("hydra", None)
    return parse(command_schema(name), raw, "")


def load(name: str, overrides: list[str] = ()):
    """`configs/<name>.yaml` with the overrides, checked: an instance of COMMANDS[name]."""
    return from_node(name, compose(name, overrides))


@functools.cache
def _preset(group: str, name: str) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose("train", [f"{group}={name}"])[group], resolve=True)


def load_preset(group: str, name: str) -> dict:
    """Option `name` of config group `group` as a run gets it: the section's defaults, then the YAML file
    (and the presets its `defaults:` list names), as plain data."""
    import copy

    return copy.deepcopy(_preset(group, name))
