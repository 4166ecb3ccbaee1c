"""train.cuda_graph: where a step can be captured (CPU), and on a GPU that a replayed step is the eager
step: the same losses and weights, the same stochastic-rounding streams, a recapture when the precision
switches, and telemetry steps run eagerly."""

import dataclasses
import json
import math

import pytest
import torch

from nvfp4train.config import load_preset
from nvfp4train.config.run import FsdpReshard, Parallel, TrainConfig
from nvfp4train.config.schema import ConfigError
from nvfp4train.model import HybridLM, ModelConfig, param_groups
from nvfp4train.optim import OptimConfig
from nvfp4train.parallel import DistInfo
from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
from nvfp4train.precision.linear import QuantLinear
from nvfp4train.train.cuda_graph import cuda_graph_blocker
from nvfp4train.train.engines import TorchEngine
from nvfp4train.train.heldout import HeldOutGraphs, evaluate_as
from nvfp4train.train.plan import RunFacts, decide_cuda_graph, plan_run
from tests.conftest import run_train

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _model(precision: str, device: str):
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict(load_preset("model", "hybrid_tiny"))
    policy = PrecisionPolicy.from_dict(load_preset("precision", precision))
    model = HybridLM(cfg, layer_factory=build_linear_factory(policy, n_blocks=len(cfg.pattern), seed=3)).to(device)
    return model, PrecisionController(policy, model), cfg


def _info(device: str) -> DistInfo:
    return DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device(device))


def _facts(precision: str) -> RunFacts:
    model, controller, cfg = _model(precision, "cpu")
    return RunFacts.of(cfg, model, controller)


def captures(setting, facts, info, parallel, activation_checkpointing="none", fsdp_reshard=False):
    return decide_cuda_graph(
        setting, facts, info.device, info.world_size, parallel, activation_checkpointing, fsdp_reshard
    )[0]


# ------------------------------------------------------------------------------ CPU: where it applies
def test_auto_runs_eager_where_a_graph_cannot_be_captured():
    model = _facts("nvfp4")
    assert "cpu" in cuda_graph_blocker(model, torch.device("cpu"), 1, "ddp", "none")
    assert captures("auto", model, _info("cpu"), "ddp") is False
    assert captures("false", model, _info("cpu"), "ddp") is False
    cuda = torch.device("cuda")
    assert "deepspeed" in cuda_graph_blocker(model, cuda, 1, "deepspeed", "none")
    assert "activation_checkpointing=full" in cuda_graph_blocker(model, cuda, 1, "ddp", "full")
    assert cuda_graph_blocker(model, cuda, 1, "ddp", "none") is None


def test_auto_captures_fsdp2_steps_and_ddp_steps_where_quantized_deepspeed_never():
    model = _facts("bf16")
    cuda = torch.device("cuda")
    assert "ddp in BF16" in cuda_graph_blocker(model, cuda, 2, "ddp", "none")
    assert cuda_graph_blocker(model, cuda, 2, "ddp", "none", explicit=True) is None
    assert cuda_graph_blocker(model, cuda, 2, "fsdp2", "none") is None
    assert cuda_graph_blocker(model, cuda, 4, "hsdp", "none") is None
    assert "reshards after forward" in cuda_graph_blocker(model, cuda, 2, "fsdp2", "none", fsdp_reshard=True)
    assert "reshards after forward" in cuda_graph_blocker(model, cuda, 4, "hsdp", "none", fsdp_reshard=True)
    assert cuda_graph_blocker(model, cuda, 2, "fsdp2", "none", explicit=True, fsdp_reshard=True) is None
    assert cuda_graph_blocker(model, cuda, 2, "ddp", "none", explicit=True, fsdp_reshard=True) is None
    assert cuda_graph_blocker(model, cuda, 2, "fsdp2", "none", explicit=True) is None
    assert cuda_graph_blocker(model, cuda, 4, "hsdp", "none", explicit=True) is None
    assert "deepspeed" in cuda_graph_blocker(model, cuda, 2, "deepspeed", "none", explicit=True)
    assert "activation_checkpointing" in cuda_graph_blocker(model, cuda, 2, "ddp", "full", explicit=True)
    info = DistInfo(rank=0, world_size=2, local_rank=0, device=cuda)
    assert captures("auto", model, info, "ddp") is False
    assert captures("true", model, info, "ddp") is True
    assert captures("true", model, info, "fsdp2") is True
    assert captures("auto", model, info, "fsdp2") is True
    assert captures("auto", model, info, "fsdp2", fsdp_reshard=True) is False
    assert captures("true", model, info, "fsdp2", fsdp_reshard=True) is True
    with pytest.raises(ConfigError, match=r"train.cuda_graph=true: .*deepspeed"):
        captures("true", model, info, "deepspeed")
    for precision in ("nvfp4", "fp8_tensorwise"):
        quantized = _facts(precision)
        assert captures("auto", quantized, info, "ddp") is True
        assert captures("auto", quantized, info, "fsdp2") is True
        assert "activation_checkpointing" in cuda_graph_blocker(quantized, cuda, 2, "ddp", "full")
        assert "activation_checkpointing" in cuda_graph_blocker(quantized, cuda, 2, "fsdp2", "full")


def test_the_plan_tells_the_capture_policy_whether_fsdp2_reshards():
    """plan_run decides train.fsdp_reshard_after_forward before train.cuda_graph: auto leaves the steps of an
    FSDP2 run that reshards after forward eager (a 2-rank DistInfo on a GPU; nothing is built)."""
    from nvfp4train.config import RunConfig

    facts = _facts("bf16")
    info = DistInfo(rank=1, world_size=2, local_rank=0, device=torch.device("cuda"))
    cases = [("fsdp2", "true", True, False), ("hsdp", "true", True, False), ("fsdp2", "false", False, True)]
    cases += [("ddp", "true", None, False)]  # DDP does not reshard; a BF16 DDP step stays eager under auto
    base = RunConfig(
        model=load_preset("model", "hybrid_tiny"),
        precision=load_preset("precision", "bf16"),
        data=load_preset("data", "bundled"),
    )
    for parallel, reshard, expected_reshard, expected_graph in cases:
        train = TrainConfig(
            parallel=Parallel(parallel), fsdp_reshard_after_forward=FsdpReshard(reshard), micro_batch_size=8
        )
        plan = plan_run(dataclasses.replace(base, train=train), info, facts)
        assert (plan.fsdp_reshard_after_forward, plan.cuda_graph) == (expected_reshard, expected_graph), parallel


def test_true_refuses_a_run_that_cannot_capture_naming_the_key():
    model = _facts("bf16")
    with pytest.raises(ConfigError, match=r"train.cuda_graph=true: .*the device is cpu.*allowed: auto"):
        captures("true", model, _info("cpu"), "ddp")


def test_train_cli_refuses_cuda_graph_true_on_cpu_with_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    proc = run_train("train.cuda_graph=true", "train.max_steps=1", f"out_dir={tmp_path / 'run'}", check=False)
    assert proc.returncode != 0
    assert "train.cuda_graph=true" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_bad_value_names_the_key(tmp_path):
    proc = run_train("train.cuda_graph=sometimes", "train.max_steps=1", f"out_dir={tmp_path / 'run'}", check=False)
    assert proc.returncode != 0
    assert "train.cuda_graph" in proc.stderr + proc.stdout


# ------------------------------------------------------------------------------ GPU: replay == eager
def _engines(precision: str):
    out = []
    for graphed in (False, True):
        model, ctl, cfg = _model(precision, "cuda")
        engine = TorchEngine(
            model, lambda m: param_groups(m, 0.1), OptimConfig(lr=3e-3), "ddp", _info("cuda"), cuda_graph=graphed
        )
        out.append((model, ctl, engine))
    return out, cfg


def _batches(cfg, steps: int, micro: int, rows: int = 2, seq: int = 64):
    g = torch.Generator().manual_seed(1)
    t = torch.randint(0, cfg.vocab_size, (steps, micro, rows, seq + 1), generator=g)
    return [[(t[s, i, :, :-1], t[s, i, :, 1:]) for i in range(micro)] for s in range(steps)]


def _sr_states(model):
    return {
        (m.label, role): state
        for m in model.modules()
        if isinstance(m, QuantLinear)
        for role, state in m.generator_state().items()
    }


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("precision", ["nvfp4", "bf16"])
@pytest.mark.parametrize("micro", [1, 2])
def test_replayed_steps_are_the_eager_steps(precision, micro):
    (eager, graphed), cfg = _engines(precision)
    losses = {0: [], 1: []}
    for step, batch in enumerate(_batches(cfg, 6, micro), start=1):
        for k, (_, ctl, engine) in enumerate((eager, graphed)):
            ctl.on_step((step - 1) / 6)
            losses[k].append(engine.train_step(batch, lr=3e-3, step=step).loss.item())
    assert graphed[2].step_graph.captures == 1  # steps 1-2 eager, 3 captured, 4-6 replayed
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=2e-3, atol=0)
    for p, q in zip(eager[0].parameters(), graphed[0].parameters()):
        torch.testing.assert_close(q, p, rtol=2e-2, atol=2e-4)
    # the SR streams advanced exactly as eager steps advance them (what a checkpoint saves)
    a, b = _sr_states(eager[0]), _sr_states(graphed[0])
    assert a.keys() == b.keys() and (precision == "bf16" or a)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
@requires_cuda
def test_switch_recaptures_and_telemetry_steps_run_eagerly():
    (_, (model, ctl, engine)), cfg = _engines("nvfp4")
    batches = _batches(cfg, 10, 1)
    for step in range(1, 4):
        engine.train_step(batches[step - 1], lr=3e-3, step=step)
    assert engine.step_graph.captures == 1
    # the schedule's switch to BF16: other recipes, so two eager warm-up steps (where torch.compile
    # recompiles), then another graph
    ctl._apply_switch(True)
    for step in (4, 5):
        engine.train_step(batches[step - 1], lr=3e-3, step=step)
        assert engine.step_graph.graph is None and engine.step_graph.captures == 1
    loss = engine.train_step(batches[5], lr=3e-3, step=6).loss
    assert engine.step_graph.captures == 2 and torch.isfinite(loss)
    for layer in ctl.layers:
        layer.stats_enabled = True
    ctl._apply_switch(False)
    engine.train_step(batches[6], lr=3e-3, step=7)  # telemetry: eager, the graph released
    assert engine.step_graph.graph is None and ctl.quant_stats()
    for layer in ctl.layers:
        layer.stats_enabled = False
    for step in (8, 9):  # NVFP4 recipes again: warmed up before, so captured at once
        loss = engine.train_step(batches[step - 1], lr=3e-3, step=step).loss
    assert engine.step_graph.captures == 3 and torch.isfinite(loss)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("precision", ["nvfp4", "nvfp4_sr_everywhere"])
def test_telemetry_steps_keep_the_graph_and_change_no_bits(precision):
    """A telemetry step runs eagerly beside the kept graph, whose next replay writes the gradients the
    optimizer reads again: the same losses, weights and SR streams, bit for bit, as releasing the graph and
    capturing it again."""
    runs = []
    for keep in (True, False):
        model, ctl, cfg = _model(precision, "cuda")
        engine = TorchEngine(
            model, lambda m: param_groups(m, 0.1), OptimConfig(lr=3e-3), "ddp", _info("cuda"), cuda_graph=True
        )
        if not keep:
            engine.step_graph._kept_through_eager_step = lambda warm: False
        losses = []
        for step, batch in enumerate(_batches(cfg, 9, 1), start=1):
            ctl.on_step((step - 1) / 9)
            for layer in ctl.layers:
                layer.stats_enabled = step in (5, 7)
            losses.append(engine.train_step(batch, lr=3e-3, step=step).loss.item())
            if step in (5, 7):
                assert (engine.step_graph.graph is not None) == keep
        runs.append((model, losses, engine.step_graph.captures))
    (kept, kept_losses, kept_captures), (released, released_losses, released_captures) = runs
    assert (kept_captures, released_captures) == (1, 3)
    assert kept_losses == released_losses
    assert all(torch.equal(p, q) for p, q in zip(kept.parameters(), released.parameters()))
    a, b = _sr_states(kept), _sr_states(released)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("mode", ["full", "forward_only"])
def test_compiled_graphed_run_switches_to_bf16(tmp_path, mode):
    """The trainer's GPU defaults (compiled, CUDA graph) through a mid-run switch to BF16: torch.compile
    recompiles for the new recipes in eager warm-up steps, not inside a capture (which failed)."""
    run_train(
        "model=hybrid_tiny",
        "precision=nvfp4",
        "precision.switch.at_fraction=0.5",
        f"precision.switch.mode={mode}",
        "train.max_steps=12",
        "train.seq_len=128",
        "train.global_batch_size=4",
        "train.log_every=1",
        "train.eval_sequences=0",
        "train.progress=false",
        f"out_dir={tmp_path}",
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert sorted(losses) == list(range(1, 13)) and all(math.isfinite(v) for v in losses.values())
    assert "capture #2" in (tmp_path / "train.log").read_text()


# ------------------------------------------------------------------------------ held-out passes as graphs
def test_held_out_passes_with_telemetry_or_forward_sr_are_not_replayed():
    model, ctl, _ = _model("nvfp4", "cpu")
    assert HeldOutGraphs.replayable(ctl.layers)
    ctl.layers[1].stats_enabled = True
    assert not HeldOutGraphs.replayable(ctl.layers)
    model, ctl, _ = _model("nvfp4_sr_everywhere", "cpu")  # the forward's operands rounded stochastically too
    assert not HeldOutGraphs.replayable(ctl.layers)


def test_the_trainer_replays_held_out_passes_only_where_it_captures_the_step(tmp_path):
    run_train(
        "model=hybrid_tiny",
        "precision=nvfp4",
        "train.max_steps=2",
        "train.seq_len=32",
        "train.global_batch_size=2",
        "train.eval_every=1",
        "train.eval_sequences=2",
        "train.progress=false",
        f"out_dir={tmp_path}",
    )
    assert "captured the held-out evaluation" not in (tmp_path / "train.log").read_text()  # a CPU run: eager


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("precision", ["nvfp4", "mxfp4", "fp8_blockwise", "bf16"])
def test_replayed_held_out_passes_are_the_eager_passes_bit_for_bit(precision):
    """Every evaluation after a step (new weights each time) replays the graphs and gives the eager pass's
    losses exactly, in each eval_precision; a switch to BF16 replaces the training-precision graph."""
    model, ctl, cfg = _model(precision, "cuda")
    engine = TorchEngine(
        model, lambda m: param_groups(m, 0.1), OptimConfig(lr=3e-3), "ddp", _info("cuda"), cuda_graph=True
    )
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(2)
    val = {name: torch.randint(0, cfg.vocab_size, (n, 65), generator=g).to(device) for name, n in (("a", 5), ("b", 3))}
    graphs = HeldOutGraphs(device)
    for step, batch in enumerate(_batches(cfg, 5, 1), start=1):
        if step == 5:
            ctl._apply_switch(True)
        ctl.on_step((step - 1) / 5)
        engine.train_step(batch, lr=3e-3, step=step)
        for eval_precision in ("both", "train", "bf16"):
            eager = evaluate_as(eval_precision, engine.module, val, 2, device, ctl.layers)
            replayed = evaluate_as(eval_precision, engine.module, val, 2, device, ctl.layers, graphs=graphs)
            assert replayed == eager, (step, eval_precision)
            assert all(math.isfinite(v) for v in eager.values())
    assert graphs.failed is None
    # BF16 and the training precision, then after the switch the BF16 layers' own setting again
    assert graphs.captures == 3 if precision != "bf16" else graphs.captures >= 1
    assert len(graphs.graphs) == 1  # the graphs of the recipes before the switch are gone
