"""Composing a command's config with Hydra: `compose(name, overrides)`, `load` (composed and checked against
COMMANDS[name]), the overrides checked before Hydra sees them, and the config groups' presets."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from nvfp4train.config.commands import COMMANDS, GROUPS, SummarySeqLen
from nvfp4train.config.run import SECTIONS, RunConfig
from nvfp4train.config.schema import ConfigError, child_type, defaults, fields_of, parse, unknown_key
from nvfp4train.data.config import DataConfig, SourceConfig


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


# Hydra's own config (`hydra.*`) can name code that Hydra instantiates and runs (hydra.callbacks.*._target_,
# the launcher's and sweeper's targets) and where Hydra writes its files (hydra.run.dir, hydra.sweep.dir,
# hydra.output_subdir): configs/train.yaml fixes those. Of Hydra's keys an override may set only these:
HYDRA_KEYS = {"hydra.verbose": "true, or the loggers to log at DEBUG level, e.g. hydra.verbose=nvfp4train"}
# A `-m` sweep may choose the submitit launcher (pip install 'nvfp4train[slurm]') and set its resources: plain
# values only. Not its `setup` (shell lines for the batch script), `srun_args`, `submitit_folder` (where the
# jobs' pickles are read from) or `_target_`: those name code or where it is loaded from.
HYDRA_LAUNCHERS = ("submitit_slurm", "submitit_local")
LAUNCHER_KEYS = (
    "timeout_min", "partition", "nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "mem_gb", "name",
    "account", "qos", "constraint", "comment", "exclude", "gres", "cpus_per_gpu", "gpus_per_task", "mem_per_gpu",
    "mem_per_cpu", "signal_delay_s", "max_num_timeout", "array_parallelism", "additional_parameters",
    "stderr_to_stdout",
)  # fmt: skip
# The resolvers an override's `${...}` may call (none of them runs code): an environment variable, another
# key with a default, the time. Plain `${key}` interpolations are always allowed. An experiment file, which
# people share, may use none of them: `${oc.env:HF_TOKEN}` would copy a secret into the runs' config.yaml.
RESOLVERS = ("oc.env", "oc.select", "now")
# Keys that Hydra's instantiate and its defaults lists read: a config of ours has none of them
SPECIAL_KEYS = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_", "_self_")
_RESOLVER_CALL = re.compile(r"\$\{\s*([^\s:{}]+)\s*:")
# Hydra's launcher flags that read a config from elsewhere (another directory or name, a pickled config)
HYDRA_FILE_FLAGS = {
    "config_path": "--config-path/-cp",
    "config_dir": "--config-dir/-cd",
    "config_name": "--config-name/-cn",
    "experimental_rerun": "--experimental-rerun",
}


def check_hydra_flags(args) -> None:
    """Hydra's parsed command line (`get_args_parser().parse_args()`): refuse the flags that load a config
    from another file, which Hydra would otherwise read (or, for --config-dir, silently ignore)."""
    for attr, flag in HYDRA_FILE_FLAGS.items():
        if getattr(args, attr, None) is not None:
            raise ConfigError(
                f"{flag}: not supported; the configs are the package's configs/ (configs/train.yaml and its "
                "groups): pass key=value overrides, or model.KEY=VALUE for a model of your own"
            )


def _special_parts(arg: str) -> list[str]:
    return [part for part in re.split(r"[.=,:/\[\]{}\s'\"]+", arg.lstrip("~+")) if part in SPECIAL_KEYS]


def _check_safe(arg: str, o, resolvers: tuple[str, ...], launcher: bool = False) -> None:
    """No override names code or moves Hydra's files: `hydra.*` only as HYDRA_KEYS allows (and, with `launcher`,
    HYDRA_LAUNCHERS and LAUNCHER_KEYS), no `_target_` (or any Hydra/OmegaConf `_special_` key), no `@package`, and
    `${resolver:...}` only for `resolvers`."""
    key = o.key_or_group if o.package is None else f"{o.key_or_group}@{o.package}"
    if not launcher:
        pass
    elif key == "hydra/launcher" and o.package is None and not o.is_delete() and not o.is_sweep_override():
        if o.get_value_element_as_str() not in HYDRA_LAUNCHERS:
            raise ConfigError(f"{arg}: allowed launchers: {', '.join(f'hydra/launcher={n}' for n in HYDRA_LAUNCHERS)}")
        return _check_resolvers(arg, resolvers)
    elif key.startswith("hydra.launcher.") and o.package is None and not o.is_delete():
        if key.partition("hydra.launcher.")[2].split(".")[0] not in LAUNCHER_KEYS or _special_parts(arg):
            raise ConfigError(
                f"{arg}: not a settable key of the submitit launcher; allowed: "
                + ", ".join(f"hydra.launcher.{k}" for k in LAUNCHER_KEYS)
            )
        return _check_resolvers(arg, resolvers)
    if key == "hydra" or key.startswith(("hydra.", "hydra/")) or (o.package or "").split(".")[0] == "hydra":
        allowed = "; ".join(f"{k}={v}" for k, v in HYDRA_KEYS.items())
        if key not in HYDRA_KEYS or o.is_delete() or o.is_add() or o.package is not None:
            raise ConfigError(
                f"{arg}: Hydra's own key {key!r} is not settable (it can name code to run or where Hydra "
                f"writes its files); allowed: {allowed}"
            )
        return
    if o.package is not None:
        raise ConfigError(f"{arg}: a config group's @package is not supported; allowed: {key}=OPTION")
    special = _special_parts(arg)
    if special:
        raise ConfigError(
            f"{arg}: {special[0]!r} is a Hydra/OmegaConf special key (it can name code to instantiate); "
            "a config holds only the keys of configs/ and its dataclasses"
        )
    _check_resolvers(arg, resolvers)


def _check_resolvers(arg: str, resolvers: tuple[str, ...]) -> None:
    for resolver in _RESOLVER_CALL.findall(arg):
        if resolver not in resolvers:
            allowed = ", ".join(["${KEY}"] + [f"${{{r}:...}}" for r in resolvers])
            raise ConfigError(f"{arg}: the resolver {resolver!r} is not allowed; allowed interpolations: {allowed}")


def check_overrides(
    overrides: list[str], name: str = "train", resolvers: tuple[str, ...] = RESOLVERS, launcher: bool = False
) -> None:
    """Check command-line overrides (`group=option`, `a.b=value`, sweeps `a=1,2`, `~a.b` deletes) against
    COMMANDS[name], and that none names code or moves Hydra's files (`_check_safe`). `resolvers`: those a
    `${name:...}` may call (an experiment file passes none); `launcher`: a training command line, which may
    choose the submitit launcher of a sweep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    schema = command_schema(name)
    for arg in overrides:  # `~key` deletes a key, the one override without `=`
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            raise ConfigError(f"argument {arg!r}: expected key=value (see configs/{name}.yaml or --help)")
    for arg in overrides:  # Hydra's grammar takes non-ASCII characters only in a quoted value
        key, _, value = arg.partition("=")
        if not value.isascii() and value[:1] not in ("'", '"') and "'" not in value:
            raise ConfigError(
                f"{arg}: a value with non-ASCII characters must be quoted for Hydra: {key}='{value}' (in a shell: "
                f"\"{key}='{value}'\")"
            )
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(" ".join(str(e).split())) from None
    for arg, o in zip(overrides, parsed):
        _check_safe(arg, o, resolvers, launcher)
    _check_deletes(list(zip(overrides, parsed)), name)
    for o in parsed:
        key = o.key_or_group
        if key.split(".")[0].split("/")[0] == "hydra":
            continue
        if o.is_delete():
            _check_key(schema, key)
            continue
        if key in GROUPS.get(name, ()):  # a config group: model, precision, data
            options = group_options(key)
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for value in values:
                if value not in options:
                    raise ConfigError(f"{key}={value}: no such {key} config; allowed: {', '.join(options)}")
        else:
            _check_key(schema, key)


def _check_deletes(overrides: list, name: str) -> None:
    """`~key` (Hydra's delete) of a whole section or group would train on its defaults and drop every
    explicit `section.*` override silently; a delete of a key that another override sets is as silent."""
    sections = set(SECTIONS).intersection(fields_of(command_schema(name))) | set(GROUPS.get(name, ()))
    for arg, o in overrides:
        if not o.is_delete():
            continue
        key = o.key_or_group
        if key in sections:
            raise ConfigError(
                f"{arg}: deleting the whole {key} section is not allowed (it would train on the defaults and drop "
                f"every {key}.* override); set its keys instead, {key}.KEY=VALUE"
            )
        for other, p in overrides:
            if not p.is_delete() and (p.key_or_group == key or p.key_or_group.startswith(key + ".")):
                raise ConfigError(f"{arg}: deletes {key}, which the override {other!r} sets; give one of the two")


def _explain(message: str) -> str:
    """Hydra's "Could not override 'data.sources.NAME...'" for a source the data config lacks: say how to
    train on one's own files instead of suggesting `+key`, which would add it to the bundled blend."""
    if message.startswith("Could not override 'precision.modules'"):
        return (
            "precision.modules: patterns are added with a leading +, e.g. '+precision.modules={*.in_proj: bf16, "
            "blocks.3.*: fp8_blockwise}' (++ where the preset has precision.modules of its own); docs/training.md"
        )
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
            cfg = hydra_compose(name, overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(_explain(" ".join(str(e).split()))) from None
    resolved(cfg)  # an interpolation that does not resolve: one line now, not a traceback later
    return cfg


def resolved(cfg) -> dict:
    """The composed config as plain data with its interpolations resolved (`???` left open); one line naming
    the key of an interpolation that does not resolve (`train.max_steps='${nope}'`, `${oc.env:UNSET}`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key, message = getattr(e, "full_key", None), " ".join(str(e).strip().splitlines()[0].split())
        where = f"{key}: " if key else ""
        raise ConfigError(
            f"{where}the interpolation does not resolve ({message}); allowed: ${{KEY}} naming "
            "a key of the config, or an environment variable ${oc.env:VAR,DEFAULT}"
        ) from None


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
    raw = resolved(cfg)  # first: check_complete would meet an interpolation that does not resolve
    check_complete(cfg)
    raw.pop("hydra", None)
    if isinstance(raw.get("precision"), dict):
        raw["precision"] = with_module_presets(raw["precision"])
    return parse(command_schema(name), raw, "")


def with_module_presets(precision: dict) -> dict:
    """The precision section with each precision.modules value that names a preset (`*.in_proj: bf16`) replaced by
    that preset's keys, as `precision=NAME` reads them: what PrecisionPolicy checks and config.yaml records. A
    mapping of precision keys stays as it is (a recorded run's)."""
    modules = precision.get("modules")
    if not isinstance(modules, dict) or all(isinstance(v, dict) for v in modules.values()):
        return precision
    options = [o for o in group_options("precision") if not o.startswith("_")]
    expanded = {}
    for pattern, value in modules.items():
        if not isinstance(value, (str, dict)):
            raise ConfigError(
                f"precision.modules.{pattern}={value!r}: allowed: a precision preset ({', '.join(options)}) "
                "or a mapping of precision keys"
            )
        if isinstance(value, str):
            if value not in options:
                raise ConfigError(
                    f"precision.modules.{pattern}={value!r}: no such precision preset; allowed: {', '.join(options)}"
                )
            value = load_preset("precision", value)
        expanded[pattern] = value
    return {**precision, "modules": expanded}


def load(name: str, overrides: list[str] = ()):
    """`configs/<name>.yaml` with the overrides, checked: an instance of COMMANDS[name]."""
    return from_node(name, compose(name, overrides))


@functools.cache
def _preset(group: str, name: str) -> dict:
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    if GlobalHydra.instance().is_initialized():
        # inside the running Hydra app (`python -m nvfp4train.train` reads precision.modules' presets): Hydra holds
        # one config loader per process, the app's, which reads these configs/ (train/__main__.py)
        from hydra import compose as hydra_compose

        return OmegaConf.to_container(hydra_compose("train", [f"{group}={name}"])[group], resolve=True)
    return OmegaConf.to_container(compose("train", [f"{group}={name}"])[group], resolve=True)


def load_preset(group: str, name: str) -> dict:
    """Option `name` of config group `group` as a run gets it: the section's defaults, then the YAML file
    (and the presets its `defaults:` list names), as plain data."""
    import copy

    return copy.deepcopy(_preset(group, name))
