"""FSDP2 at its defaults: train.fsdp_reshard_after_forward=auto decides by memory (and says why), the
prefetch setting reaches FSDP2, NVFP4's quantized weights are built once per optimizer step (not once per
all-gather), NVFP4 under FSDP2 on two gloo ranks trains like one rank, and compiles every block."""

import math

import pytest
import torch
import torch.distributed

from nvfp4train import parallel
from nvfp4train.config import TrainConfig
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.model.hybrid import param_groups
from nvfp4train.optim import OptimConfig
from nvfp4train.precision import PrecisionController, build_linear_factory
from nvfp4train.precision.ops import LayerState
from nvfp4train.train.engines import TorchEngine
from nvfp4train.train.heldout import evaluate_as
from tests.conftest import SMALL_MODEL, read_metrics, run_torchrun, run_train
from tests.precision.helpers import load_preset

SMALL = {**SMALL_MODEL, "name": "fsdp_small"}
CPU = parallel.DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))


def test_reshard_auto_keeps_gathered_weights_when_they_are_small():
    memory = parallel.device_memory_bytes(CPU.device)
    small = int(parallel.KEEP_GATHERED_MAX_SHARE * memory / 2)  # exactly at the limit: kept
    keep, why = parallel.resolve_reshard_after_forward("auto", small, CPU)
    assert keep is False and "auto -> false" in why and "GB" in why
    reshard, why = parallel.resolve_reshard_after_forward("auto", small + 10**6, CPU)
    assert reshard is True and "auto -> true" in why
    assert parallel.resolve_reshard_after_forward("true", 1, CPU)[0] is True
    assert parallel.resolve_reshard_after_forward("false", 10**15, CPU)[0] is False


@pytest.mark.parametrize("value, expected", [(True, "true"), (False, "false"), ("auto", "auto")])
def test_reshard_setting_reads_yaml_booleans(value, expected):
    assert TrainConfig(fsdp_reshard_after_forward=value).fsdp_reshard_after_forward == expected
    assert TrainConfig().fsdp_reshard_after_forward == "auto" and TrainConfig().fsdp_prefetch == 1


@pytest.fixture
def one_rank_group(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("reshard_after_forward", [False, True])
def test_reshard_fsdp_frees_the_weights_an_evaluation_left_gathered(one_rank_group, reshard_after_forward):
    """An evaluation's forward leaves FSDP2's gathered weights behind (all of them without resharding after
    forward; the last block and the root with it), which an eager step after CUDA-graph replays would use
    instead of the updated weights: reshard_fsdp, which the captured step calls, frees them."""
    from torch.distributed.tensor import DTensor

    model = HybridLM(ModelConfig.from_dict(SMALL))
    parallel.shard_fsdp2(model, reshard_after_forward=reshard_after_forward)
    assert all(isinstance(p, DTensor) for p in model.parameters())  # sharded
    with torch.no_grad():
        model(torch.randint(0, SMALL["vocab_size"], (1, 16)))
    gathered = [p for p in model.parameters() if not isinstance(p, DTensor)]
    assert gathered and any(p is q for p in gathered for q in model.blocks[-1].parameters())
    parallel.reshard_fsdp(model)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    parallel.reshard_fsdp(HybridLM(ModelConfig.from_dict(SMALL)))  # no FSDP2: nothing to do


@pytest.mark.parametrize("prefetch", [0, 2])
def test_prefetch_reaches_fsdp2(one_rank_group, prefetch):
    model = HybridLM(ModelConfig.from_dict(SMALL))
    parallel.shard_fsdp2(model, reshard_after_forward=True, prefetch=prefetch)
    blocks = list(model.blocks)
    forward = [block._get_fsdp_state()._states_to_forward_prefetch for block in blocks]
    backward = [block._get_fsdp_state()._states_to_backward_prefetch for block in blocks]
    if prefetch == 0:
        assert all(not f for f in forward) and all(not b for b in backward)
    else:
        assert [len(f) for f in forward] == [2, 2, 1, 0]
        assert [len(b) for b in backward] == [0, 1, 2, 2]


@pytest.mark.parametrize("reshard", ["true", "false"])
def test_nvfp4_weights_are_quantized_once_per_step_under_fsdp2(one_rank_group, monkeypatch, reshard):
    """Each micro-batch's forward (and, resharded, each backward) gathers the weights into fresh storage:
    the weight cache still quantizes each layer's weight once per optimizer step, and once per evaluation. (A
    one-rank group stands in for two: the DistInfo's world size picks the FSDP2 path, the sharding is real.)"""
    policy = load_preset("nvfp4", bf16_first=0, bf16_last=0)
    cfg = ModelConfig.from_dict(SMALL)
    torch.manual_seed(0)
    model = HybridLM(cfg, layer_factory=build_linear_factory(policy, n_blocks=len(cfg.pattern), seed=3))
    controller = PrecisionController(policy, model)
    engine = TorchEngine(
        model, lambda m: param_groups(m, 0.1), OptimConfig(), "fsdp2", CPU, reshard_after_forward=reshard == "true"
    )
    assert engine.reshard_after_forward is (reshard == "true")
    calls = []
    for method in ("pack", "quantize", "quantize_with_transpose"):
        real = getattr(LayerState, method)

        def spy(state, role, *args, real=real):
            if role.endswith("_w"):
                calls.append((state.sr.label, role))
            return real(state, role, *args)

        monkeypatch.setattr(LayerState, method, spy)
    g = torch.Generator().manual_seed(1)
    quantized = [layer for layer in controller.layers if layer.quantized]
    assert quantized
    for step in range(3):
        controller.on_step(step / 3)
        calls.clear()
        batches = [(t[:, :-1], t[:, 1:]) for t in torch.randint(0, 97, (3, 2, 17), generator=g)]
        stats = engine.train_step(batches, lr=1e-3, step=step)
        assert torch.isfinite(stats.loss)
        if step == 0:
            continue  # telemetry step (stats_every): operands are quantized one by one there
        fprop = [c for c in calls if c[1] == "fprop_w"]
        assert sorted(fprop) == sorted((layer.label, "fprop_w") for layer in quantized), calls
    # an evaluation (two batches, each gathering afresh where resharded): once per layer too, weights only
    calls.clear()
    val = {"a": torch.randint(0, 97, (4, 17), generator=g)}
    evaluate_as("train", engine.module, val, 2, CPU.device, controller.layers)
    assert sorted(calls) == sorted((layer.label, "fprop_w") for layer in quantized), calls


COMMON = [
    "train.max_steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "precision=nvfp4",
]


def _torchrun(out, *extra):
    return run_torchrun(f"out_dir={out}", *COMMON, *extra)


def test_nvfp4_under_fsdp2_on_two_ranks_tracks_one_rank(tmp_path):
    """The same global batches through one process (4 micro-batches a step) and two FSDP2 ranks (2 each,
    gradient accumulation under no_sync): the losses agree within BF16/NVFP4 rounding."""
    run_train(f"out_dir={tmp_path / 'one'}", *COMMON)
    _torchrun(tmp_path / "fsdp", "train.parallel=fsdp2")
    one = [r["loss"] for r in read_metrics(tmp_path / "one") if "loss" in r]
    fsdp = [r["loss"] for r in read_metrics(tmp_path / "fsdp") if "loss" in r]
    assert len(one) == len(fsdp) == 4
    assert fsdp == pytest.approx(one, rel=2e-3)  # measured: within 3.1e-4 over 4 steps
    log = (tmp_path / "fsdp" / "train.log").read_text()
    assert "train.fsdp_reshard_after_forward=auto -> false" in log  # a tiny model: kept, and said


def test_compiled_fsdp2_compiles_every_quantized_block(tmp_path):
    """Compiled under FSDP2, each block's forward is a frame of its own and each quantized block compiles
    its own entry (its layer id is a constant of its ops): with more blocks than dynamo's default recompile
    limit (8), the blocks past it would fall back to eager, the emulated quantizers op by op."""
    proc = _torchrun(
        tmp_path / "fsdp",
        "model=hybrid_tiny",
        "model.pattern='------------'",  # 12 MLP blocks (the CPU compile of a Mamba block is not needed here)
        "train.parallel=fsdp2",
        "train.compile=true",
    )
    output = proc.stdout + proc.stderr
    assert "recompile_limit" not in output, output[-3000:]
    losses = [r["loss"] for r in read_metrics(tmp_path / "fsdp") if "loss" in r]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)


def test_fsdp2_is_silent_about_the_views_this_model_never_modifies(one_rank_group):
    """FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip the all-gather); the
    blocks' and the model's outputs are views that nothing modifies in place: no warning per run."""
    import warnings

    model = HybridLM(ModelConfig.from_dict(SMALL))
    tokens = torch.randint(0, SMALL["vocab_size"], (1, 16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel.shard_fsdp2(model)
        model(tokens, tokens).backward()
    assert not [w for w in caught if "returned a view tensor" in str(w.message)], [str(w.message) for w in caught]
