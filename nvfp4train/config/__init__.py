"""The one config mechanism: every command's options are a dataclass, Hydra composes them, `schema` checks them.

`compose(name, overrides)` composes `configs/<name>.yaml` for the commands that take Hydra-style
`key=value` arguments (train, eval, export, generate, summary), `load(name, overrides)` also checks the
result against that command's dataclass (`COMMANDS`), and `usage(name, doc)` is their `--help`. A bad key,
a missing one or a bad value is one `ConfigError` line that names the key and what is allowed; the
overrides are checked against the dataclasses before Hydra sees them, so Hydra's own wording never shows.

A training run (`RunConfig`) is made of sections: `model` (ModelConfig), `precision` (PrecisionPolicy), `data`
(DataConfig), `optim` (OptimConfig) and `train` (TrainConfig, here). `configs/train.yaml` starts from every
section's dataclass defaults (registered with Hydra's ConfigStore as `nvfp4train_defaults`), then one option
of each config group (`configs/model/`, `configs/precision/`, `configs/data/`), then the overrides.
The checking itself (types, StrEnum choices, `bounded` ranges) is `nvfp4train.config.schema`, which the
dataclasses of model, precision, data and optim use too; the other modules here sit above those packages (they
import them), so this package's names load on first use: importing `nvfp4train.config.schema` from below
does not import the packages that import it.

`configs/` sits at the repository root; a wheel ships a copy inside the package (`setup.py`).

The package's modules, by topic: `run` (RunConfig, TrainConfig), `commands` (the other commands' options,
COMMANDS, GROUPS), `composition` (Hydra composition, checking, presets), `help_text` (--help), `schema` (the
validator). Import the names from `nvfp4train.config`.
"""

from typing import TYPE_CHECKING

from nvfp4train.config.schema import ConfigError

if TYPE_CHECKING:
    from nvfp4train.config.commands import (
        COMMANDS,
        GROUPS,
        EvalConfig,
        ExportConfig,
        GenerateConfig,
        SummaryConfig,
        SummarySeqLen,
    )
    from nvfp4train.config.composition import (
        CONFIG_DIR,
        check_complete,
        check_hydra_flags,
        check_overrides,
        compose,
        from_node,
        group_options,
        load,
        load_preset,
        register_defaults,
    )
    from nvfp4train.config.help_text import help_requested, usage
    from nvfp4train.config.run import SECTIONS, RunConfig, TrainConfig, WandbConfig, resolve_micro_batch

__all__ = [
    "COMMANDS",
    "CONFIG_DIR",
    "GROUPS",
    "SECTIONS",
    "ConfigError",
    "EvalConfig",
    "ExportConfig",
    "GenerateConfig",
    "RunConfig",
    "SummaryConfig",
    "SummarySeqLen",
    "TrainConfig",
    "WandbConfig",
    "check_complete",
    "check_hydra_flags",
    "check_overrides",
    "compose",
    "from_node",
    "group_options",
    "help_requested",
    "load",
    "load_preset",
    "register_defaults",
    "resolve_micro_batch",
    "usage",
]


# The modules whose names this package exports, in the order they import each other. No module shares a name with a
# function it exports: importing a submodule sets the package's attribute of that name, which would then hide the
# function from `from nvfp4train.config import ...`.
_MODULES = ("commands", "composition", "run", "help_text")


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import types

    for module in [importlib.import_module(f"{__name__}.{m}") for m in _MODULES]:
        for exported in __all__:
            value = vars(module).get(exported)
            if value is not None and not isinstance(value, types.ModuleType):
                globals()[exported] = value
    return globals()[name]
