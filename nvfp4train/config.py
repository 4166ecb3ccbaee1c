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
The checking itself (types, StrEnum choices, `bounded` ranges) is `nvfp4train.schema`, which the rooms'
dataclasses use too; this module sits above them (it imports model, precision, data, optim).

`configs/` sits at the repository root; a wheel ships a copy inside the package (`setup.py`).
"""
from __future__ import annotations

import dataclasses
import functools
import re
import textwrap
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from nvfp4train.data.config import DataConfig, SourceConfig, parse_data_config
from nvfp4train.model.config import ModelConfig
from nvfp4train.optim import OptimConfig
from nvfp4train.precision.recipe import PrecisionPolicy
from nvfp4train.schema import ConfigError, bounded, check, child_type, defaults, fields_of, parse, to_plain, unknown_key

__all__ = ["COMMANDS", "CONFIG_DIR", "ConfigError", "EvalConfig", "ExportConfig", "GenerateConfig", "RunConfig",
           "SummaryConfig", "TrainConfig", "WandbConfig", "check_overrides", "compose", "from_node",
           "group_options", "help_requested", "load", "load_preset", "register_defaults", "resolve_micro_batch",
           "usage"]


def _config_dir() -> Path:
    package = Path(__file__).resolve().parent
    shipped = package / "configs"  # a wheel's copy (setup.py); a source checkout has none
    return shipped if shipped.is_dir() else package.parent / "configs"


CONFIG_DIR = _config_dir()


Device = StrEnum("Device", "auto cpu cuda")
Parallel = StrEnum("Parallel", "ddp fsdp2 deepspeed")
Progress = StrEnum("Progress", "auto true false")
Compile = StrEnum("Compile", "auto true false")
CudaGraph = StrEnum("CudaGraph", "auto true false")
ActivationCheckpointing = StrEnum("ActivationCheckpointing", "none full selective")
WandbMode = StrEnum("WandbMode", "auto online offline")
FsdpReshard = StrEnum("FsdpReshard", "auto true false")
EvalPrecision = StrEnum("EvalPrecision", "train bf16")


@dataclass(frozen=True)
class WandbConfig:
    enabled: bool = False
    """Log to Weights & Biases too (metrics.jsonl is always written)."""
    mode: WandbMode = WandbMode.auto
    """auto: online with WANDB_API_KEY, else offline."""
    project: str = "nvfp4train"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team or user); null: the API key's default."""
    group: str | None = None
    """Runs of one group are compared together; null: the `experiment` key."""
    name: str | None = None
    """The run's name; null: W&B picks one."""

    def __post_init__(self):
        check(self, "train.wandb")


@dataclass(frozen=True)
class TrainConfig:
    """The CPU default: a few minutes on 2 cores."""
    max_steps: int = bounded(300, ge=1)
    """Optimizer steps to train for."""
    seq_len: int = bounded(128, ge=1)
    """Tokens per training sequence."""
    global_batch_size: int = bounded(16, ge=1)
    """Sequences per optimizer step, over all ranks."""
    micro_batch_size: int | None = bounded(None, ge=1)
    """Sequences per forward/backward on one rank (gradient accumulation fills the rest); null: the
    global batch divided by the world size (no accumulation), so the defaults run at any world size."""
    log_every: int = bounded(10, ge=1)
    """Write a metrics line every N steps."""
    eval_every: int = bounded(0, ge=0)
    """Held-out validation loss every N steps (0: only at the end)."""
    eval_sequences: int = bounded(64, ge=0)
    """Held-out sequences per data source (of seq_len + 1 tokens; fewer if the source's val split is shorter):
    the same default as `python -m nvfp4train.eval`'s heldout_sequences, so both measure the same set;
    0: no held-out evaluation (as Megatron's --eval-iters 0)."""
    eval_precision: EvalPrecision = EvalPrecision.train
    """The GEMMs of the in-training validation: train (the run's own precision at that step) | bf16 (every
    linear in BF16, as the evaluation of a final checkpoint)."""
    save_every: int = bounded(0, ge=0)
    """Checkpoint every N steps (0: only the final one)."""
    keep_last: int = bounded(3, ge=1)
    """Keep this many checkpoints."""
    resume: str = "auto"
    """auto (the latest checkpoint in out_dir, if any) | never | the path of a checkpoint directory."""
    overwrite: bool = False
    """With resume=never on an out_dir that holds a run: move that run aside to `<out_dir>.replaced-<time>/`
    and start afresh (without it the run refuses)."""
    device: Device = Device.auto
    """auto: cuda when available, else cpu."""
    parallel: Parallel = Parallel.ddp
    """Used when WORLD_SIZE > 1 (deepspeed also at 1)."""
    zero_stage: int = bounded(1, ge=1, le=2)
    """DeepSpeed ZeRO stage (1 or 2)."""
    compile: Compile = Compile.auto
    """torch.compile the whole model (and its loss): auto (on CUDA, not on CPU, where compiling costs more
    than it saves) | true | false."""
    cuda_graph: CudaGraph = CudaGraph.auto
    """Capture each step's forward and backward passes as one CUDA graph and replay it (train/cuda_graph.py):
    auto (single-process CUDA runs without activation checkpointing or the te backend) | true (refuses a
    run where it cannot) | false. Removes the host's launch overhead, which bounds the emulated
    low-precision steps of small models; the same numerics as eager steps."""
    deterministic: bool = False
    """Bitwise-reproducible training on a GPU: the same config and seed give the same losses and weights on
    the same GPU model and software (torch's deterministic mode, cuBLAS's deterministic workspace, math
    attention, mamba-ssm's deterministic SSD with pinned kernel configs; train/determinism.py). Costs speed
    (docs/determinism.md); CPU runs are reproducible without it."""
    activation_checkpointing: ActivationCheckpointing = ActivationCheckpointing.none
    """Recompute activations in backward to save memory: none | full (every block) | selective (every
    second block, torchtitan's `selective` by layer)."""
    ddp_bucket_cap_mb: int = bounded(25, ge=1)
    """train.parallel=ddp: MB of gradients per all-reduce bucket (torch's default 25). Under train.compile
    the compiled graph is also split at these bucket boundaries (dynamo's DDP optimizer), so larger
    buckets mean fewer, larger graphs and fewer, later all-reduces."""
    fsdp_reshard_after_forward: FsdpReshard = FsdpReshard.auto
    """train.parallel=fsdp2: true frees each block's gathered weights after its forward and gathers them
    again in backward (ZeRO-3 memory); false keeps them until backward (one all-gather a step fewer,
    2 bytes a parameter more); auto: false when the model's gathered BF16 weights take at most 1/8 of the
    device's memory (hybrid_1b on an 80 GB GPU), else true. train.log says which, and why."""
    fsdp_prefetch: int = bounded(1, ge=0, le=8)
    """train.parallel=fsdp2: blocks whose weights are all-gathered ahead of use (the next ones in
    forward, the previous ones in backward); 0 leaves FSDP2's implicit prefetch (issued when the CPU
    reaches the next block)."""
    preempt_check_every: int = bounded(10, ge=1)
    """With several ranks, agree on a SIGTERM/SIGUSR1/SIGINT every N steps (the all-reduce is a host
    sync; a signal is answered with a checkpoint at most N-1 steps later). One process checks every step."""
    max_nonfinite_steps: int = bounded(5, ge=1)
    """Halt after this many non-finite steps in a row (each one is skipped)."""
    spike_factor: float = bounded(3.0, gt=1.0)
    """A loss above spike_factor x its running mean (after warmup) is logged as a spike."""
    progress: Progress = Progress.auto
    """A progress bar: auto (when interactive) | true | false."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases logging."""

    def __post_init__(self):
        for key in ("progress", "compile", "cuda_graph", "fsdp_reshard_after_forward"):
            if isinstance(getattr(self, key), bool):  # YAML and Hydra read true/false as booleans
                object.__setattr__(self, key, str(getattr(self, key)).lower())
        check(self, "train")
        if not self.resume:
            raise ConfigError(f"train.resume={self.resume!r}: allowed auto, never, or a checkpoint directory")
        if self.resume not in ("auto", "never") and not Path(self.resume).is_dir():
            raise ConfigError(f"train.resume={self.resume!r}: not a checkpoint directory "
                              "(allowed: auto, never, or the path of a checkpoint directory)")
        if self.micro_batch_size is not None and self.global_batch_size % self.micro_batch_size:
            raise ConfigError(f"train.global_batch_size={self.global_batch_size} must be a multiple of "
                              f"train.micro_batch_size={self.micro_batch_size}")


def resolve_micro_batch(train: TrainConfig, world_size: int) -> TrainConfig:
    """`train` with micro_batch_size set: as given, or the global batch split over the ranks (as torchtitan's
    local batch and Megatron's default are), checked against the world size."""
    micro = train.micro_batch_size
    if micro is None:
        if train.global_batch_size % world_size:
            raise ConfigError(f"train.global_batch_size={train.global_batch_size} must be a multiple of the world "
                              f"size {world_size} (or set train.micro_batch_size with gradient accumulation)")
        micro = train.global_batch_size // world_size
    if train.global_batch_size % (micro * world_size):
        raise ConfigError(f"train.global_batch_size={train.global_batch_size} must be a multiple of "
                          f"train.micro_batch_size x world size = {micro} x {world_size} = {micro * world_size} "
                          f"(leave train.micro_batch_size unset to derive it)")
    return dataclasses.replace(train, micro_batch_size=micro)


# The sections a run is made of and the dataclass each one is checked against.
SECTIONS = {"model": ModelConfig, "precision": PrecisionPolicy, "data": DataConfig, "optim": OptimConfig,
            "train": TrainConfig}


@dataclass(frozen=True)
class RunConfig:
    model: dict[str, Any]
    """The model section as plain data (checked by ModelConfig)."""
    precision: dict[str, Any]
    """The precision section as plain data (checked by PrecisionPolicy)."""
    data: dict[str, Any]
    """The data section as plain data (checked by nvfp4train.data.parse_data_config)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Steps, batch, checkpoints, parallelism, logging."""
    out_dir: Path = Path("runs/default")
    """Where metrics.jsonl, config.yaml and checkpoints/ go."""
    seed: int = bounded(1234, ge=0)
    """Seeds the initial weights, the data order and stochastic rounding."""
    experiment: str = "default"
    """Runs of one experiment share a W&B group."""

    def __post_init__(self):
        check(self, "")
        # parsed once, here; the plain data above stays what config.yaml and checkpoints record
        object.__setattr__(self, "_parsed", (ModelConfig.from_dict(self.model),
                                             PrecisionPolicy.from_dict(self.precision)))
        parse_data_config(self.data)  # the data room parses it again where it reads the files

    @property
    def model_config(self) -> ModelConfig:
        """The model section as the checked ModelConfig."""
        return self._parsed[0]

    @property
    def policy(self) -> PrecisionPolicy:
        """The precision section as the checked PrecisionPolicy."""
        return self._parsed[1]

    @classmethod
    def from_omegaconf(cls, cfg) -> RunConfig:
        return from_node("train", cfg)

    def to_dict(self) -> dict:
        return {**to_plain(self), "out_dir": str(self.out_dir)}


# ------------------------------------------------------------------------------- the other commands' options
# Their keys, defaults and meanings are in configs/<name>.yaml (shown by --help); the dataclasses hold the
# same defaults (tests/test_config.py compares them) and the types, choices and ranges.

ExportDtype = StrEnum("ExportDtype", "float32 bfloat16")
GenerateDtype = StrEnum("GenerateDtype", "auto float32 bfloat16")


@dataclass(frozen=True)
class EvalConfig:
    """`python -m nvfp4train.eval`: configs/eval.yaml."""
    run_dir: Path
    step: int | None = bounded(None, ge=0)
    tasks: Any = "all"  # all, comma-separated names or a list: eval.harness.select_tasks names a wrong one
    heldout_sequences: int = bounded(64, ge=1)
    max_items: int = bounded(0, ge=0)
    batch_size: int = bounded(16, ge=1)
    device: Device = Device.auto

    def __post_init__(self):
        check(self, "")


@dataclass(frozen=True)
class ExportConfig:
    """`python -m nvfp4train.export`: configs/export.yaml."""
    run_dir: Path
    step: int | None = bounded(None, ge=0)
    out: Path | None = None
    dtype: ExportDtype = ExportDtype.float32
    overwrite: bool = False

    def __post_init__(self):
        check(self, "")


@dataclass(frozen=True)
class GenerateConfig:
    """`python -m nvfp4train.generate`: configs/generate.yaml."""
    run_dir: Path
    step: int | None = bounded(None, ge=0)
    prompt: str = ""
    max_new_tokens: int = bounded(100, ge=1)
    temperature: float = bounded(0.8, ge=0)
    top_k: int = bounded(50, ge=0)
    num_samples: int = bounded(1, ge=1)
    seed: int = bounded(0, ge=0)
    device: Device = Device.auto
    dtype: GenerateDtype = GenerateDtype.auto
    json: bool = False

    def __post_init__(self):
        check(self, "")


@dataclass(frozen=True)
class SummarySeqLen:
    seq_len: int = bounded(TrainConfig.__dataclass_fields__["seq_len"].default, ge=1)

    def __post_init__(self):
        check(self, "train")


@dataclass(frozen=True)
class SummaryConfig:
    """`python -m nvfp4train.summary`: configs/summary.yaml (a model config and the sequence length)."""
    model: ModelConfig
    train: SummarySeqLen = field(default_factory=SummarySeqLen)

    def __post_init__(self):
        check(self, "")


# Each command's configs/<name>.yaml and the dataclass that checks it; the config groups it takes.
COMMANDS = {"train": RunConfig, "eval": EvalConfig, "export": ExportConfig, "generate": GenerateConfig,
            "summary": SummaryConfig}
GROUPS = {"train": ("model", "precision", "data"), "summary": ("model",)}


# ---------------------------------------------------------------------------------------------- composition

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


def _schema(name: str):
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

    schema = _schema(name)
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
        return (f"{m.group(1)}: the data config has no source {m.group(2)!r}; to train on your own files: "
                "data=own data.sources.own.train=[a.jsonl,b.txt] data.sources.own.val=held.jsonl (docs/data.md)")
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
        example = (" (e.g. run_dir=runs/default)" if key == "run_dir" else
                   f" (e.g. {key}=data/mine.jsonl; see docs/data.md)" if key.startswith("data.") else "")
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
    return parse(_schema(name), raw, "")


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


# ------------------------------------------------------------------------------------------------------ --help

def help_requested(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)


def usage(name: str, doc: str) -> str:
    """`--help` of `python -m nvfp4train.<name>` (not train's, which has its own): the usage line and what the
    command does (configs/<name>.yaml's first line), the module docstring after its first paragraph, then the
    options: the config groups and keys of configs/<name>.yaml with their defaults and comments, and the
    choices of every key that takes a fixed set of values (from the dataclass)."""
    schema = _schema(name)
    lines = (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()
    command = re.match(r"#\s*`([^`]+)`:?\s*(.*)", lines[0])
    out = [f"usage: {command.group(1) if command else f'python -m nvfp4train.{name} key=value ...'}", ""]
    if command and command.group(2):
        out += [command.group(2)[0].upper() + command.group(2)[1:], ""]
    # the docstring's first paragraph is its own usage line, which the YAML's repeats
    out += doc.strip().split("\n\n", 1)[1].strip("\n").splitlines() if "\n\n" in doc.strip() else []
    out += ["", f"options (key=value; configs/{name}.yaml):"]
    hints = {f.name: f.type for f in dataclasses.fields(schema)}
    for line in lines[1:]:
        group = re.match(r"\s+-\s+([A-Za-z_]\w*):\s*(\S+)\s*(?:#\s*(.*))?$", line)
        key = re.match(r"([A-Za-z_]\w*):\s*(.*?)\s*(?:#\s*(.*))?$", line)
        if group and group.group(1) in GROUPS.get(name, ()):
            g, default, comment = group.groups()
            options = ", ".join(o for o in group_options(g) if not o.startswith("_"))
            text = f"{comment + '; ' if comment else ''}one of: {options}"
            out += textwrap.wrap(text, 110, initial_indent=f"  {g + '=' + default:<26} ", subsequent_indent=" " * 29)
            out.append(f"  {g + '.KEY=VALUE':<26} one field of the {g} config")
        elif key and key.group(1) in hints:
            k, value, comment = key.groups()
            value = "(required)" if value == "???" else value
            choices = _choices(schema, k)
            if choices and not (comment and all(c in comment for c in choices)):
                comment = f"{comment + '; ' if comment else ''}{' | '.join(choices)}"
            out.append(f"  {k + '=' + value:<26} {comment or ''}".rstrip())
    for f in dataclasses.fields(schema):  # a section of its own keys that the YAML does not spell out
        if f.name not in GROUPS.get(name, ()) and dataclasses.is_dataclass(section := child_type(schema, f.name)):
            out += [f"  {f.name}.{k}={v}" for k, v in defaults(section).items()]
    return "\n".join(out)


def _choices(schema, key: str) -> list[str]:
    tp = child_type(schema, key)
    return [m.value for m in tp] if isinstance(tp, type) and issubclass(tp, StrEnum) else []
