"""The options of the commands other than train (eval, export, generate, summary), which dataclass checks each
command's configs/<name>.yaml (`COMMANDS`) and which config groups it takes (`GROUPS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from nvfp4train.config.run import Device, EvalPrecision, RunConfig, TrainConfig
from nvfp4train.config.schema import bounded, check
from nvfp4train.model.config import ModelConfig

# ------------------------------------------------------------------------------- the other commands' options
# Their keys, defaults and meanings are in configs/<name>.yaml (shown by --help); the dataclasses hold the
# same defaults (tests/test_config_commands.py compares them) and the types, choices and ranges.

ExportDtype = StrEnum("ExportDtype", "float32 bfloat16")
ExportWeights = StrEnum("ExportWeights", "dense nvfp4_packed")
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
    eval_precision: EvalPrecision = EvalPrecision.bf16

    def __post_init__(self):
        check(self, "")


@dataclass(frozen=True)
class ExportConfig:
    """`python -m nvfp4train.export`: configs/export.yaml."""

    run_dir: Path
    step: int | None = bounded(None, ge=0)
    out: Path | None = None
    dtype: ExportDtype = ExportDtype.float32
    weights: ExportWeights = ExportWeights.dense
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
COMMANDS = {
    "train": RunConfig,
    "eval": EvalConfig,
    "export": ExportConfig,
    "generate": GenerateConfig,
    "summary": SummaryConfig,
}
GROUPS = {"train": ("model", "precision", "data"), "summary": ("model",)}
