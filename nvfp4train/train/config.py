"""The run's configuration as plain data, validated once at start-up.

Hydra composes `configs/train.yaml` with its groups; `RunConfig.from_omegaconf` turns the result into
typed dataclasses and raises `ConfigError` with a one-line message naming the key and what is allowed.
The model, precision and data sections are validated by their own rooms' `from_dict`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from nvfp4train.optim import OptimConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
TOP_LEVEL_KEYS = ("model", "precision", "data", "optim", "train", "out_dir", "seed", "experiment")


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and what is allowed."""


@dataclass(frozen=True)
class WandbConfig:
    enabled: bool = False
    mode: str = "auto"            # auto | online | offline
    project: str = "nvfp4train"
    entity: str | None = None
    group: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 300
    seq_len: int = 128
    global_batch_size: int = 16
    micro_batch_size: int = 16
    log_every: int = 10
    eval_every: int = 0
    eval_sequences: int = 16
    save_every: int = 0
    keep_last: int = 3
    resume: str = "auto"
    device: str = "auto"
    parallel: str = "ddp"
    zero_stage: int = 1
    compile: bool = False
    max_nonfinite_steps: int = 5
    spike_factor: float = 3.0
    progress: str = "auto"
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self) -> None:
        for key in ("max_steps", "seq_len", "global_batch_size", "micro_batch_size", "log_every",
                    "keep_last", "max_nonfinite_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"train.{key}={value!r}: must be a positive integer")
        for key in ("eval_every", "save_every", "eval_sequences"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"train.{key}={value!r}: must be an integer >= 0")
        _one_of("train.device", self.device, ("auto", "cpu", "cuda"))
        _one_of("train.parallel", self.parallel, ("ddp", "fsdp2", "deepspeed"))
        _one_of("train.progress", str(self.progress).lower(), ("auto", "true", "false"))
        _one_of("train.wandb.mode", self.wandb.mode, ("auto", "online", "offline"))
        if self.zero_stage not in (1, 2):
            raise ConfigError(f"train.zero_stage={self.zero_stage!r}: allowed 1, 2")
        if not isinstance(self.resume, str) or not self.resume:
            raise ConfigError(f"train.resume={self.resume!r}: allowed auto, never, or a checkpoint directory")
        if self.resume not in ("auto", "never") and not Path(self.resume).is_dir():
            raise ConfigError(f"train.resume={self.resume!r}: not a checkpoint directory "
                              "(allowed: auto, never, or the path of a checkpoint directory)")
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(f"train.global_batch_size={self.global_batch_size} must be a multiple of "
                              f"train.micro_batch_size={self.micro_batch_size}")
        if self.spike_factor <= 1.0:
            raise ConfigError(f"train.spike_factor={self.spike_factor}: must be > 1")


@dataclass(frozen=True)
class RunConfig:
    model: dict
    precision: dict
    data: dict
    optim: OptimConfig
    train: TrainConfig
    out_dir: Path
    seed: int
    experiment: str

    @classmethod
    def from_omegaconf(cls, cfg) -> "RunConfig":
        from omegaconf import OmegaConf

        raw = OmegaConf.to_container(cfg, resolve=True)
        raw.pop("hydra", None)
        for key in raw:
            if key not in TOP_LEVEL_KEYS:
                raise ConfigError(f"{key}: unknown top-level key; allowed: {', '.join(TOP_LEVEL_KEYS)}")
        for key in TOP_LEVEL_KEYS:
            if key not in raw:
                raise ConfigError(f"{key}: missing from the config")
        try:
            optim = OptimConfig.from_dict(raw["optim"])
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        train = _dataclass_from_dict(TrainConfig, raw["train"], "train")
        train.validate()
        seed = raw["seed"]
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seed={seed!r}: must be an integer >= 0")
        if not raw["out_dir"]:
            raise ConfigError("out_dir: must be a directory path")
        return cls(model=raw["model"], precision=raw["precision"], data=raw["data"], optim=optim,
                   train=train, out_dir=Path(raw["out_dir"]), seed=seed, experiment=str(raw["experiment"]))

    def to_dict(self) -> dict:
        d = {"model": self.model, "precision": self.precision, "data": self.data,
             "optim": asdict(self.optim), "train": asdict(self.train), "out_dir": str(self.out_dir),
             "seed": self.seed, "experiment": self.experiment}
        d["optim"]["betas"] = list(self.optim.betas)
        return d


def _one_of(key: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r}: allowed {', '.join(map(str, allowed))}")


def _dataclass_from_dict(cls, d: dict, prefix: str):
    allowed = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in d.items():
        if key not in allowed:
            raise ConfigError(f"{prefix}.{key}: unknown key; allowed: {', '.join(sorted(allowed))}")
        if key == "wandb":
            value = _dataclass_from_dict(WandbConfig, value or {}, f"{prefix}.wandb")
        kwargs[key] = value
    return cls(**kwargs)
