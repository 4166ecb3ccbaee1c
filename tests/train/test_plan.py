"""train/plan.py: every `auto` made a decision with its reason, once; explicit settings kept; what cannot run
refused in one line; the plan recorded in config.yaml (`resolved:`) without making the same config look like
another one to a resume."""

import dataclasses

import pytest
import torch

from nvfp4train.config import ConfigError, RunConfig, load_preset
from nvfp4train.config.run import TrainConfig, WandbConfig
from nvfp4train.parallel import DistInfo
from nvfp4train.runs import is_record
from nvfp4train.train import rundir
from nvfp4train.train.plan import RunFacts, plan_run, tri_state

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
CUDA_RANK1 = DistInfo(rank=1, world_size=2, local_rank=1, device=torch.device("cuda", 1))
FACTS = RunFacts(
    n_params=2_780_000,
    mamba_blocks=2,
    quantized=True,
    te_layers=False,
    precision_backend="emulated",
    precision_backend_reason="auto: not te: no GPU",
)


def _cfg(**train) -> RunConfig:
    return RunConfig(
        model=load_preset("model", "hybrid_tiny"),
        precision=load_preset("precision", "nvfp4"),
        data=load_preset("data", "bundled"),
        train=TrainConfig(micro_batch_size=16, **train),
    )


def test_tri_state_is_none_for_auto_and_a_bool_otherwise():
    assert tri_state("auto") is None and tri_state(True) is True and tri_state("false") is False
    with pytest.raises(ValueError, match="maybe"):
        tri_state("maybe")


def test_cpu_turns_compile_and_cuda_graph_off_with_reasons():
    plan = plan_run(_cfg(), CPU, FACTS, micro_derived=False)
    assert (plan.device, plan.parallel, plan.compile, plan.cuda_graph) == ("cpu", "single", False, False)
    assert plan.reasons["device"] == "train.device=auto: no CUDA GPU is visible"
    assert plan.reasons["compile"] == "train.compile=auto: eager on cpu (compiling costs more than it saves)"
    assert plan.reasons["cuda_graph"] == "train.cuda_graph=auto: eager steps (the device is cpu, not cuda)"
    assert plan.fsdp_reshard_after_forward is None and plan.hsdp_shard_size is None  # one process: no FSDP2
    assert plan.ssd_backend == "torch" and "PyTorch scan (on cpu)" in plan.reasons["ssd_backend"]
    assert plan.precision_backend == "emulated" and plan.reasons["precision_backend"] == FACTS.precision_backend_reason
    assert (plan.micro_batch_size, plan.grad_accum) == (16, 1)
    assert plan.wandb_mode is None and plan.progress is False  # W&B off; a test's stderr is no terminal


def test_explicit_settings_are_kept_and_derived_ones_say_so(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x")
    cfg = _cfg(compile="false", cuda_graph="true", progress="false", wandb=WandbConfig(enabled=True))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_size=4))
    plan = plan_run(cfg, CUDA_RANK1, FACTS, micro_derived=True)
    assert (plan.device, plan.parallel, plan.compile, plan.cuda_graph) == ("cuda", "ddp", False, True)
    assert plan.reasons["compile"] == "train.compile=false"
    assert plan.reasons["cuda_graph"] == "train.cuda_graph=true: the step is captured"
    assert plan.progress is False and plan.reasons["progress"] == "not the main rank"
    assert plan.wandb_mode == "online" and "WANDB_API_KEY" in plan.reasons["wandb_mode"]
    assert (plan.micro_batch_size, plan.grad_accum) == (4, 2)  # 16 sequences over 2 ranks of 4
    assert plan.reasons["micro_batch_size"] == "train.micro_batch_size=null: train.global_batch_size=16 over 2 rank(s)"
    # BF16 DDP on two ranks: auto leaves the step eager (the host keeps ahead), and says why
    bf16 = dataclasses.replace(FACTS, quantized=False)
    plan = plan_run(_cfg(), CUDA_RANK1, bf16)
    assert plan.cuda_graph is False and "ddp in BF16" in plan.reasons["cuda_graph"]


def test_what_cannot_run_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^train.compile=true: on CPU, .*SSD scan.*allowed here: auto"):
        plan_run(_cfg(compile="true"), CPU, FACTS)
    with pytest.raises(ConfigError, match=r"^train.cuda_graph=true: cannot capture the step here: the device is cpu"):
        plan_run(_cfg(cuda_graph="true"), CPU, FACTS)
    assert plan_run(_cfg(compile="true"), CPU, dataclasses.replace(FACTS, mamba_blocks=0)).compile is True


def test_the_plan_is_recorded_as_data_and_as_lines():
    plan = plan_run(_cfg(), CPU, FACTS)
    assert plan.to_dict()["cuda_graph"] == {"value": False, "reason": plan.reasons["cuda_graph"]}
    record = {"step": 1, "tokens": 2048, **plan.metrics()}
    assert record["resolved/device"] == "cpu" and is_record(record)  # the run-directory reader takes it
    lines = plan.lines()
    assert len(lines) == len(plan.decisions())
    by_name = {line.split()[0]: line.split(None, 2)[1:] for line in lines}
    assert by_name["compile"] == ["false", f"({plan.reasons['compile']})"]
    assert by_name["hsdp_shard_size"] == ["-", "(not HSDP)"]


def test_config_yaml_with_or_without_resolved_is_the_same_config(tmp_path):
    """A resume compares the config part of config.yaml: an older file without `resolved:`, or one whose
    decisions were made on another machine, is the same run's config (no config.step_<N>.yaml kept)."""
    config = "model:\n  name: hybrid_tiny\ntrain:\n  max_steps: 6\n"
    new = config + "resolved:\n  device:\n    value: cpu\n"
    assert rundir.config_part(new) == config and rundir.config_part(config) == config
    (tmp_path / "config.yaml").write_text(config)  # written before the plan was recorded
    assert rundir.history_held(tmp_path, new) == []
    assert rundir.save_config(tmp_path, new, resumed_step=6) is None
    assert (tmp_path / "config.yaml").read_text() == new and sorted(p.name for p in tmp_path.iterdir()) == [
        "config.yaml"
    ]
    changed = new.replace("max_steps: 6", "max_steps: 9")
    kept = rundir.save_config(tmp_path, changed, resumed_step=6)  # another config: the previous one is kept
    assert kept.name == "config.step_00000006.yaml" and kept.read_text() == new


def test_the_first_step_says_what_it_waits_for(monkeypatch, tmp_path):
    """A compiled or captured first step waits for compilation (and, on a machine's first run, autotuning)
    before it prints anything: the line before it says so and where the caches that make it quick live."""
    from types import SimpleNamespace

    from nvfp4train.train.trainer import Trainer

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "kernels" / "triton"))
    note = Trainer._first_step_note(SimpleNamespace(plan=SimpleNamespace(compile=True, cuda_graph=True)))
    assert note.startswith("step 1: compiling the model and capturing the step (")
    assert str(tmp_path / "kernels") in note
    eager_graph = Trainer._first_step_note(SimpleNamespace(plan=SimpleNamespace(compile=False, cuda_graph=True)))
    assert eager_graph.startswith("step 1: capturing the step (")
