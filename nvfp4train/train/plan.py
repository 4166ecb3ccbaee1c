"""The run's decisions as data: every setting left to `auto` (and every derived one) made a fact, with its reason.

    facts = RunFacts.of(model_cfg, model, controller)    what the built model and its precision say of themselves
    plan = plan_run(cfg, info, facts)                     the decisions, made once (ConfigError for what cannot run)
    plan.cuda_graph, plan.reasons["cuda_graph"]           a decision and why
    plan.lines()                                          the block train.log gets
    plan.to_dict()                                        config.yaml's `resolved:` and the first metrics record

The trainer builds the plan once, after the model and the precision controller and before the engine; the
engine, the progress bar and W&B read it instead of deciding again. A tri-state setting (auto | true | false)
is `bool | None` going in (`tri_state`) and a bool coming out.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn as nn

from nvfp4train import parallel as dist
from nvfp4train.config import ConfigError, RunConfig
from nvfp4train.model.ops import triton_ssd_available, triton_ssd_deterministic_mode
from nvfp4train.model.ssd import resolve_ssd_backend
from nvfp4train.runs import RESOLVED, RESOLVED_PREFIX
from nvfp4train.train.cuda_graph import cuda_graph_blocker


def tri_state(setting) -> bool | None:
    """A tri-state setting (train.compile, train.cuda_graph, train.progress, train.fsdp_reshard_after_forward)
    as `bool | None`: None for auto."""
    text = str(setting).lower()
    if text not in ("auto", "true", "false"):
        raise ValueError(f"tri_state: {setting!r} is not auto, true or false")
    return None if text == "auto" else text == "true"


@dataclass(frozen=True)
class RunFacts:
    """What the built model and its precision controller say about themselves: the plan's inputs beside the
    config and the process group (train/ asks these, not the layer classes)."""

    n_params: int
    mamba_blocks: int
    quantized: bool  # some linear runs its GEMMs in a low-precision format (at the start of the run)
    te_layers: bool  # the linears are Transformer Engine's (precision.backend=te)
    precision_backend: str
    precision_backend_reason: str
    # what precision.modules decided: one line per pattern, its preset and the linears it decides
    precision_modules: tuple[str, ...] = ()

    @classmethod
    def of(cls, model_cfg, model: nn.Module, controller) -> RunFacts:
        return cls(
            n_params=sum(p.numel() for p in model.parameters()),
            mamba_blocks=model_cfg.count("M"),
            quantized=any(layer.quantized for layer in controller.layers),
            te_layers=controller.backend_name == "te",
            precision_backend=controller.backend_name,
            precision_backend_reason=controller.backend_reason,
            precision_modules=tuple(controller.module_lines),
        )


@dataclass(frozen=True)
class RunPlan:
    """Every decision the config left open, made for this process group and this model."""

    device: str  # cpu | cuda
    world_size: int
    parallel: str  # single | ddp | fsdp2 | hsdp | deepspeed
    micro_batch_size: int
    grad_accum: int  # micro-batches per step on each rank
    hsdp_shard_size: int | None  # ranks per FSDP2 shard group (None: not HSDP)
    fsdp_reshard_after_forward: bool | None  # None: not FSDP2
    compile: bool
    cuda_graph: bool
    progress: bool  # a drawn progress bar (else plain lines every log_every steps)
    wandb_mode: str | None  # online | offline (None: W&B off)
    precision_backend: str
    precision_modules: str | None  # the linears precision.modules gave another preset, by pattern (None: none)
    ssd_backend: str | None  # the Mamba blocks' scan: torch | triton (None: no Mamba blocks)
    reasons: Mapping[str, str] = field(default_factory=dict)

    def decisions(self) -> dict:
        """{decision: value}, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "reasons"}

    def to_dict(self) -> dict:
        """What config.yaml records under `resolved:`: each decision and its reason."""
        return {
            name: {"value": value, "reason": self.reasons.get(name, "")} for name, value in self.decisions().items()
        }

    def metrics(self) -> dict:
        """The decisions as the first metrics record's `resolved/<name>` fields (numbers, booleans, text, null)."""
        return {RESOLVED_PREFIX + name: value for name, value in self.decisions().items()}

    def lines(self) -> list[str]:
        """One line per decision: `name: value (reason)`."""
        width = max(len(name) for name in self.decisions())
        return [
            f"  {name:<{width}} {_text(value)}" + (f" ({self.reasons[name]})" if self.reasons.get(name) else "")
            for name, value in self.decisions().items()
        ]


def _text(value) -> str:
    return "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def decide_compile(setting, device_type: str, mamba_blocks: int) -> tuple[bool, str]:
    """train.compile: auto compiles on CUDA only (on CPU compiling costs more than it saves); true on CPU is
    refused for a model with Mamba blocks, whose PyTorch SSD scan Inductor's CPU code gets wrong."""
    wanted = tri_state(setting)
    if wanted and device_type == "cpu" and mamba_blocks:
        raise ConfigError(
            f"train.compile=true: on CPU, torch {torch.__version__.split('+')[0]}'s compiled code for the Mamba "
            "blocks' SSD scan returns NaN (eager is right); allowed here: auto (compiles on CUDA only) or false"
        )
    if wanted is not None:
        return wanted, f"train.compile={str(wanted).lower()}"
    if device_type == "cuda":
        return True, "train.compile=auto: compiled on cuda"
    return False, f"train.compile=auto: eager on {device_type} (compiling costs more than it saves)"


def decide_cuda_graph(
    setting,
    facts: RunFacts,
    device: torch.device,
    world_size: int,
    parallel: str,
    activation_checkpointing: str = "none",
    fsdp_reshard: bool = False,
) -> tuple[bool, str]:
    """train.cuda_graph: auto captures the step where it can (cuda_graph.cuda_graph_blocker), true refuses a
    run where it cannot, naming why. fsdp_reshard: FSDP2 reshards after forward (decided)."""
    wanted = tri_state(setting)
    if wanted is False:
        return False, "train.cuda_graph=false"
    blocker = cuda_graph_blocker(
        facts,
        device,
        world_size,
        parallel,
        activation_checkpointing,
        explicit=wanted is True,
        fsdp_reshard=fsdp_reshard,
    )
    if blocker is None:
        return True, f"train.cuda_graph={setting}: the step is captured"
    if wanted:
        raise ConfigError(
            f"train.cuda_graph=true: cannot capture the step here: {blocker}; "
            f"allowed: auto (captures where it can) or false"
        )
    return False, f"train.cuda_graph=auto: eager steps ({blocker})"


def _terminal_columns() -> int:
    """Width of the terminal stderr writes to; 0 when it has none (a pipe, or a pty that reports 0x0)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


PROGRESS_MIN_COLUMNS = 40  # a narrower terminal gets plain lines: tqdm would draw nothing there


def decide_progress(setting, is_main: bool) -> tuple[bool, str]:
    """train.progress: a drawn bar (auto: when stderr is a terminal) where the terminal is wide enough to
    draw one; plain lines every train.log_every steps otherwise."""
    if not is_main:
        return False, "not the main rank"
    wanted = tri_state(setting)
    if wanted is False:
        return False, "train.progress=false"
    if wanted is None and not sys.stderr.isatty():
        return False, "train.progress=auto: stderr is not a terminal"
    columns = _terminal_columns()
    if columns < PROGRESS_MIN_COLUMNS:
        return False, f"train.progress={setting}: the terminal is {columns} columns wide (a bar needs 40)"
    return True, f"train.progress={setting}: a terminal of {columns} columns"


def decide_wandb_mode(wandb_cfg) -> tuple[str | None, str]:
    """train.wandb.mode: auto is online with a W&B key (WANDB_API_KEY or ~/.netrc), else offline (wandb.init
    fails at once without a key in online mode)."""
    if not wandb_cfg.enabled:
        return None, "train.wandb.enabled=false"
    if str(wandb_cfg.mode) != "auto":
        return str(wandb_cfg.mode), f"train.wandb.mode={wandb_cfg.mode}"
    if os.environ.get("WANDB_API_KEY"):
        return "online", "train.wandb.mode=auto: WANDB_API_KEY is set"
    if (Path.home() / ".netrc").exists():
        return "online", "train.wandb.mode=auto: ~/.netrc exists"
    return "offline", "train.wandb.mode=auto: no W&B key (WANDB_API_KEY or ~/.netrc)"


def decide_ssd_backend(setting, mamba_blocks: int, device_type: str) -> tuple[str | None, str]:
    """model.ssd_backend: the scan the Mamba blocks run (model/ssd.py's resolve_ssd_backend, with this
    process's deterministic mode and mamba-ssm's kernels)."""
    if not mamba_blocks:
        return None, "no Mamba blocks"
    is_cuda = device_type == "cuda"
    deterministic = torch.are_deterministic_algorithms_enabled()
    check_triton = is_cuda and str(setting) != "torch"
    available = triton_ssd_available() if check_triton else False
    triton_deterministic = triton_ssd_deterministic_mode() if check_triton and deterministic else False
    try:
        backend = resolve_ssd_backend(str(setting), is_cuda, deterministic, available, triton_deterministic)
    except ValueError as e:
        raise ConfigError(f"model.{e}") from None
    if str(setting) != "auto":
        return backend, f"model.ssd_backend={setting}"
    if backend == "triton":
        return backend, "model.ssd_backend=auto: mamba-ssm's Triton kernels on cuda"
    if not is_cuda:
        why = f"on {device_type}"
    elif not available:
        why = "mamba-ssm's Triton kernels are not installed"
    else:
        why = "deterministic mode, and this mamba-ssm has no deterministic SSD backward"
    return backend, f"model.ssd_backend=auto: the PyTorch scan ({why})"


def plan_run(cfg: RunConfig, info: dist.DistInfo, facts: RunFacts, micro_derived: bool = False) -> RunPlan:
    """The decisions of a run of `cfg` (train.micro_batch_size already derived: `micro_derived` says it was)
    on `info`'s process group, for the model `facts` describes. Raises ConfigError for an explicit setting
    that cannot run here."""
    t, world = cfg.train, info.world_size
    reasons: dict[str, str] = {}
    device = info.device.type
    reasons["device"] = f"train.device={t.device}" + (
        f": {'a CUDA GPU is visible' if device == 'cuda' else 'no CUDA GPU is visible'}" if t.device == "auto" else ""
    )
    reasons["world_size"] = "WORLD_SIZE" if world > 1 else "one process"
    parallel = str(t.parallel) if world > 1 or t.parallel == "deepspeed" else "single"
    reasons["parallel"] = f"train.parallel={t.parallel}" + (
        " (one process: no wrapper)" if parallel == "single" else ""
    )
    micro = t.micro_batch_size
    grad_accum = t.global_batch_size // (micro * world)
    reasons["micro_batch_size"] = (
        f"train.micro_batch_size=null: train.global_batch_size={t.global_batch_size} over {world} rank(s)"
        if micro_derived
        else f"train.micro_batch_size={micro}"
    )
    reasons["grad_accum"] = f"{t.global_batch_size} sequences / ({micro} x {world} rank(s))"
    fsdp = t.parallel in ("fsdp2", "hsdp") and world > 1
    hsdp_shard = None
    if fsdp and t.parallel == "hsdp":
        replicas, hsdp_shard = dist.hsdp_shape(t.hsdp_shard_size, world)
        reasons["hsdp_shard_size"] = (
            f"train.hsdp_shard_size={t.hsdp_shard_size}"
            + (": the ranks of a node" if not t.hsdp_shard_size else "")
            + f" ({replicas} replica(s))"
        )
    else:
        reasons["hsdp_shard_size"] = "not HSDP"
    reshard = None
    if fsdp:
        reshard, reasons["fsdp_reshard_after_forward"] = dist.resolve_reshard_after_forward(
            str(t.fsdp_reshard_after_forward), facts.n_params, info
        )
    else:
        reasons["fsdp_reshard_after_forward"] = "not FSDP2"
    if t.parallel == "deepspeed":  # DeepSpeed runs the model and its step: neither compiled nor captured here
        compile_, reasons["compile"] = False, "train.parallel=deepspeed (DeepSpeed runs the model)"
        graph, reasons["cuda_graph"] = False, "train.parallel=deepspeed (DeepSpeed's hooks and step are not captured)"
    else:
        compile_, reasons["compile"] = decide_compile(t.compile, device, facts.mamba_blocks)
        graph, reasons["cuda_graph"] = decide_cuda_graph(
            t.cuda_graph,
            facts,
            info.device,
            world,
            str(t.parallel),
            str(t.activation_checkpointing),
            fsdp_reshard=bool(reshard),
        )
    progress, reasons["progress"] = decide_progress(t.progress, info.is_main)
    wandb_mode, reasons["wandb_mode"] = decide_wandb_mode(t.wandb)
    reasons["precision_backend"] = facts.precision_backend_reason
    modules = "; ".join(facts.precision_modules) or None
    reasons["precision_modules"] = (
        "precision.modules: the last pattern that matches a linear decides it" if modules else "no precision.modules"
    )
    ssd, reasons["ssd_backend"] = decide_ssd_backend(cfg.model.ssd_backend, facts.mamba_blocks, device)
    return RunPlan(
        device=device,
        world_size=world,
        parallel=parallel,
        micro_batch_size=micro,
        grad_accum=grad_accum,
        hsdp_shard_size=hsdp_shard,
        fsdp_reshard_after_forward=reshard,
        compile=compile_,
        cuda_graph=graph,
        progress=progress,
        wandb_mode=wandb_mode,
        precision_backend=facts.precision_backend,
        precision_modules=modules,
        ssd_backend=ssd,
        reasons=reasons,
    )


__all__ = [
    "RESOLVED",
    "RunFacts",
    "RunPlan",
    "decide_compile",
    "decide_cuda_graph",
    "decide_progress",
    "decide_ssd_backend",
    "decide_wandb_mode",
    "plan_run",
    "tri_state",
]
