"""A training run's config: `RunConfig`, made of typed sections (ModelConfig, PrecisionPolicy, DataConfig,
OptimConfig, TrainConfig), each parsed once, and `TrainConfig` (steps, batch, checkpoints, parallelism,
logging)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from nvfp4train.config.schema import INT64_MAX, ConfigError, bounded, check, to_plain
from nvfp4train.data.config import DataConfig, parse_data_config
from nvfp4train.model.config import ModelConfig
from nvfp4train.optim import OptimConfig
from nvfp4train.precision.recipe import PrecisionPolicy

Device = StrEnum("Device", "auto cpu cuda")
Parallel = StrEnum("Parallel", "ddp fsdp2 hsdp deepspeed")
Progress = StrEnum("Progress", "auto true false")
Compile = StrEnum("Compile", "auto true false")
CudaGraph = StrEnum("CudaGraph", "auto true false")
ActivationCheckpointing = StrEnum("ActivationCheckpointing", "none full selective")
WandbMode = StrEnum("WandbMode", "auto online offline")
FsdpReshard = StrEnum("FsdpReshard", "auto true false")
EvalPrecision = StrEnum("EvalPrecision", "train bf16 both")


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
class FinalEvalConfig:
    """`python -m nvfp4train.eval`'s options (configs/eval.yaml, the same defaults) for the final checkpoint,
    evaluated in the training process when it reaches train.max_steps."""

    enabled: bool = False
    """Evaluate the final checkpoint after training, in this process (no second start-up), into
    out_dir/eval.json: the same file and numbers as `python -m nvfp4train.eval run_dir=<out_dir>` with these
    options. One process only: a run of several ranks is evaluated afterwards with that command."""
    tasks: Any = "all"
    """all, or comma-separated names from evals/tasks.yaml (checked before training starts)."""
    heldout_sequences: int = bounded(64, ge=1)
    """Held-out sequences per data source."""
    max_items: int = bounded(0, ge=0)
    """Items per task (0: all)."""
    batch_size: int = bounded(16, ge=1)
    """Sequences per evaluation batch."""
    eval_precision: EvalPrecision = EvalPrecision.bf16
    """bf16 | train | both, as eval's eval_precision."""

    def __post_init__(self):
        check(self, "train.final_eval")


# A step's tokens over all ranks, at most: Llama 3's largest batch was 16M tokens; a run asking for more than
# a hundred times that is a typo (an extra zero, a batch meant per rank), and would spend its first minutes
# planning the step's data order before it ran out of memory.
MAX_TOKENS_PER_STEP = 2**31


@dataclass(frozen=True)
class TrainConfig:
    """The CPU default: 1-2 minutes on 2 cores."""

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
    linear in BF16, as the evaluation of a final checkpoint) | both (BF16 as `val/*`, the same numbers as a
    bf16 run's, and the training precision as `val_tp/*`; a step that trains in BF16 is evaluated once and
    writes both). An evaluation leaves training as it found it: a run's losses do not depend on this key."""
    save_every: int = bounded(0, ge=0)
    """Checkpoint every N steps (0: only the final one)."""
    keep_last: int = bounded(3, ge=1)
    """Keep this many checkpoints."""
    resume: str = "auto"
    """auto (the latest checkpoint in out_dir, if any) | never | the path of a checkpoint directory."""
    overwrite: bool = False
    """With resume=never on an out_dir that holds a run, or resume=auto on one that holds a run's history
    but no checkpoint: move that run's own entries aside to `<out_dir>.replaced-<time>/` and start afresh
    (without it the run refuses)."""
    resume_foreign: bool = False
    """Continue from a checkpoint of another run (another run id, seed or model than the checkpoints in
    out_dir record: train/identity.py); without it such a resume is refused."""
    device: Device = Device.auto
    """auto: cuda when available, else cpu."""
    parallel: Parallel = Parallel.ddp
    """Used when WORLD_SIZE > 1 (deepspeed also at 1): ddp | fsdp2 (weights, gradients and optimizer state
    sharded over all ranks) | hsdp (sharded inside each group of train.hsdp_shard_size ranks, replicated
    across groups) | deepspeed (ZeRO-1/2)."""
    zero_stage: int = bounded(1, ge=1, le=2)
    """DeepSpeed ZeRO stage (1 or 2)."""
    compile: Compile = Compile.auto
    """torch.compile the whole model (and its loss): auto (on CUDA, not on CPU, where compiling costs more
    than it saves) | true (refused on CPU for a model with Mamba blocks: Inductor's CPU code for their
    SSD scan returns NaN) | false."""
    cuda_graph: CudaGraph = CudaGraph.auto
    """Capture each step's forward and backward passes as one CUDA graph and replay it (train/cuda_graph.py):
    auto (CUDA runs of one process, FSDP2/HSDP runs with their collectives, and DDP runs with quantized
    linears, whose eager steps wait on the host; not with activation checkpointing or the te backend) | true
    (also captures BF16 DDP steps; refuses a run where it cannot: DeepSpeed) | false. DDP steps are captured
    with their all-reduce after 11 eager ones, FSDP2's after 2. Removes the host's launch overhead, which
    bounds the emulated low-precision steps of small models; the same numerics as eager steps."""
    deterministic: bool = False
    """Bitwise-reproducible training on a GPU: the same config and seed give the same losses and weights on
    the same GPU model and software (torch's deterministic mode, cuBLAS's deterministic workspace, math
    attention, mamba-ssm's deterministic SSD with pinned kernel configs; train/determinism.py). Costs speed
    (docs/determinism.md); CPU runs are reproducible without it."""
    activation_checkpointing: ActivationCheckpointing = ActivationCheckpointing.none
    """Recompute activations in backward to save memory: none | full (every block) | selective (every
    second block, torchtitan's `selective` by layer)."""
    ddp_bucket_cap_mb: int = bounded(100, ge=1)
    """train.parallel=ddp: MB of gradients per all-reduce bucket (torch's default is 25). Under train.compile
    the compiled graph is also split at these bucket boundaries (dynamo's DDP optimizer), so larger
    buckets mean fewer, larger graphs and fewer, later all-reduces: hybrid_1b on two GPUs ran 1.84x one
    GPU at 25 and 1.89x at 100 and 400 (docs/distributed.md)."""
    fsdp_reshard_after_forward: FsdpReshard = FsdpReshard.auto
    """train.parallel=fsdp2 (and hsdp): true frees each block's gathered weights after its forward and gathers them
    again in backward (ZeRO-3 memory); false keeps them until backward (one all-gather a step fewer,
    2 bytes a parameter more); auto: false when the model's gathered BF16 weights take at most 1/8 of the
    device's memory (hybrid_1b on an 80 GB GPU), else true. train.log says which, and why."""
    hsdp_shard_size: int = bounded(0, ge=0)
    """train.parallel=hsdp: FSDP2 shards over groups of this many ranks and replicates across the groups
    (the gradients of each shard are all-reduced between its replicas); 0: the ranks of one node
    (torchrun's LOCAL_WORLD_SIZE, or SLURM's tasks per node), so the all-gathers stay inside a node and
    only the gradient all-reduce crosses the network. Must divide the number of ranks."""
    fsdp_prefetch: int = bounded(1, ge=0, le=8)
    """train.parallel=fsdp2 (and hsdp): blocks whose weights are all-gathered ahead of use (the next ones in
    forward, the previous ones in backward); 0 leaves FSDP2's implicit prefetch (issued when the CPU
    reaches the next block)."""
    preempt_check_every: int = bounded(10, ge=1)
    """With several ranks, agree on a SIGTERM/SIGUSR1/SIGINT every N steps (the all-reduce is a host
    sync; a signal is answered with a checkpoint at most N-1 steps later). One process checks every step."""
    max_nonfinite_steps: int = bounded(5, ge=1)
    """Halt after this many non-finite steps in a row (each one is skipped)."""
    spike_factor: float = bounded(3.0, gt=1.0)
    """A loss above spike_factor x its running mean (after warmup) is logged as a spike."""
    profile_start: int = bounded(0, ge=0)
    """torch.profiler from this optimizer step on (0: off), for train.profile_steps steps: a chrome trace per
    rank and rank 0's summary (a step's elapsed time beside its GPU kernels' time, that time by kind of
    kernel) in out_dir/profile/ (train/profiling.py)."""
    profile_steps: int = bounded(2, ge=1)
    """How many steps the profiler window takes (train.profile_start)."""
    progress: Progress = Progress.auto
    """A progress bar: auto (when interactive) | true | false."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases logging."""
    final_eval: FinalEvalConfig = field(default_factory=FinalEvalConfig)
    """The final checkpoint's evaluation in this process (train.final_eval.enabled=true and eval's keys)."""
    tensorboard: bool = False
    """Also write metrics.jsonl's numbers as TensorBoard scalars to out_dir/tensorboard/ (pip install
    'nvfp4train[tensorboard]'; `tensorboard --logdir runs`)."""

    def __post_init__(self):
        for key in ("progress", "compile", "cuda_graph", "fsdp_reshard_after_forward"):
            if isinstance(getattr(self, key), bool):  # YAML and Hydra read true/false as booleans
                object.__setattr__(self, key, str(getattr(self, key)).lower())
        check(self, "train")
        if not self.resume:
            raise ConfigError(f"train.resume={self.resume!r}: allowed auto, never, or a checkpoint directory")
        if self.resume not in ("auto", "never") and not Path(self.resume).is_dir():
            raise ConfigError(
                f"train.resume={self.resume!r}: not a checkpoint directory "
                "(allowed: auto, never, or the path of a checkpoint directory)"
            )
        per_step = self.global_batch_size * self.seq_len
        if per_step > MAX_TOKENS_PER_STEP:
            raise ConfigError(
                f"train.global_batch_size={self.global_batch_size} x train.seq_len={self.seq_len} = {per_step:.3g} "
                f"tokens a step, more than 2**31 = {MAX_TOKENS_PER_STEP:,} (100x the batches of the largest published "
                "pretraining runs); lower train.global_batch_size"
            )
        tokens = self.max_steps * self.global_batch_size * self.seq_len
        if tokens > INT64_MAX:  # the data order numbers every sample and token of a run as an int64
            raise ConfigError(
                f"train.max_steps={self.max_steps}: x train.global_batch_size x train.seq_len = {tokens:.3g} "
                f"training tokens, more than 2**63-1; lower train.max_steps"
            )
        if self.micro_batch_size is not None and self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"train.global_batch_size={self.global_batch_size} must be a multiple of "
                f"train.micro_batch_size={self.micro_batch_size}"
            )


def resolve_micro_batch(train: TrainConfig, world_size: int) -> TrainConfig:
    """`train` with micro_batch_size set: as given, or the global batch split over the ranks (as torchtitan's
    local batch and Megatron's default are), checked against the world size."""
    micro, total = train.micro_batch_size, train.global_batch_size
    step = world_size * (micro or 1)
    if total % step:
        near = " or ".join(
            f"train.global_batch_size={n}" for n in sorted({total // step * step, -(-total // step) * step}) if n
        )
        if micro is None:
            raise ConfigError(
                f"train.global_batch_size={total} is not a multiple of the world size {world_size}: set {near} "
                f"(each rank then takes global/{world_size} sequences a step)"
            )
        per_rank = total // world_size if total % world_size == 0 else None
        choices = [m for m in range(1, per_rank + 1) if per_rank % m == 0] if per_rank else []
        other = f", or train.micro_batch_size one of {', '.join(map(str, choices))}" if choices else ""
        raise ConfigError(
            f"train.global_batch_size={total} is not a multiple of train.micro_batch_size x world size = "
            f"{micro} x {world_size} = {step}: set {near}{other}"
        )
    micro = micro or total // world_size
    return dataclasses.replace(train, micro_batch_size=micro)


# The sections a run is made of and the dataclass each one is checked against.
SECTIONS = {
    "model": ModelConfig,
    "precision": PrecisionPolicy,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
}


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    """The model (a mapping is parsed by ModelConfig.from_dict)."""
    precision: PrecisionPolicy
    """The precision policy (a mapping is parsed by PrecisionPolicy.from_dict)."""
    data: DataConfig
    """The data sources and blend (a mapping is parsed by nvfp4train.data.parse_data_config)."""
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
        # each section parsed once, here, in the order of the fields (the first bad one is the one named)
        for key, parse_section in (
            ("model", ModelConfig.from_dict),
            ("precision", PrecisionPolicy.from_dict),
            ("data", parse_data_config),
        ):
            if isinstance(getattr(self, key), Mapping):
                object.__setattr__(self, key, parse_section(getattr(self, key)))
        check(self, "")
        self.precision.check_module_names(self.model.linear_modules())  # precision.modules' patterns

    @property
    def model_config(self) -> ModelConfig:
        """Alias of `model` (from when the section was plain data beside its parsed copy)."""
        return self.model

    @property
    def policy(self) -> PrecisionPolicy:
        """Alias of `precision` (from when the section was plain data beside its parsed copy)."""
        return self.precision

    @classmethod
    def from_omegaconf(cls, cfg) -> RunConfig:
        from nvfp4train.config import from_node  # compose imports this module

        return from_node("train", cfg)

    def to_dict(self) -> dict:
        """The run's one record, as plain data: config.yaml, a checkpoint's meta.json, W&B's config. The data
        section is recorded as it was given (DataConfig.to_dict), the others as their checked values."""
        record = {
            f.name: self.data.to_dict() if f.name == "data" else to_plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
        }
        return {**record, "out_dir": str(self.out_dir)}
