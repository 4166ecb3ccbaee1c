"""train.compile=true: a model of factory-built QuantLinear layers under torch.compile gives eager's
loss and gradients bit for bit, for every preset in configs/precision/.

The quantized GEMMs are custom ops (one opaque graph node each, whose eager code runs inside the
compiled graph, so the bits cannot depend on the compiler); what this checks is that the model
compiles through them without a graph break, autograd flows through their registered backward
(AOTAutograd traces it), the weight cache and the SR streams behave alike, and SR draws match.
The "aot_eager" backend traces with dynamo and AOTAutograd like the default one but skips
inductor's C++ code generation (minutes on a 2-core CI box)."""

from pathlib import Path

import pytest
import torch
from torch import nn

from nvfp4train.precision import PrecisionController, build_linear_factory

from .helpers import load_preset

pytestmark = pytest.mark.integration  # dynamo and AOTAutograd trace a model per preset: not the quick loop


@pytest.fixture(autouse=True, scope="module")
def _fresh_compiler_after_this_module():
    """Forget what torch.compile traced here when the module ends: dynamo keeps its caches (and its decision to
    mark shapes dynamic) per code object across tests, and this module's compiles used to make a later compile
    of the same model code fail (tests/model/test_compile.py::test_torch_compile_matches_eager run after it:
    "cannot determine truth value of Relational")."""
    yield
    torch._dynamo.reset()


PRESET_NAMES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs" / "precision").glob("*.yaml"))
N_BLOCKS = 4  # the FP8 presets keep the first block and the last two in BF16: block 1 is quantized


class Stack(nn.Module):
    def __init__(self, factory, d=32, hidden=64):
        super().__init__()
        self.fc1 = nn.ModuleList(factory.linear(d, hidden, block_index=i, name="fc1") for i in range(N_BLOCKS))
        self.fc2 = nn.ModuleList(factory.linear(hidden, d, block_index=i, name="fc2") for i in range(N_BLOCKS))

    def forward(self, x):
        for fc1, fc2 in zip(self.fc1, self.fc2):
            x = x + fc2(torch.relu(fc1(x)))
        return x.float().square().mean()


def loss_and_grads(policy, compile_model: bool):
    torch.manual_seed(0)
    model = Stack(build_linear_factory(policy, N_BLOCKS, seed=3))
    ctl = PrecisionController(policy, model)
    forward = torch.compile(model, backend="aot_eager") if compile_model else model
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    results = []
    for step in range(2):  # the second step checks the SR streams advanced alike
        ctl.on_step(step / 2)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(x)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    return results, ctl


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_compiled_model_matches_eager_bit_for_bit(preset):
    policy = load_preset(preset)
    eager, eager_ctl = loss_and_grads(policy, compile_model=False)
    compiled, compiled_ctl = loss_and_grads(policy, compile_model=True)
    for (loss_e, grads_e), (loss_c, grads_c) in zip(eager, compiled):
        assert torch.equal(loss_e, loss_c)
        assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_c))
    if preset != "bf16":
        assert any(not layer.recipe.all_bf16 for layer in eager_ctl.layers), "no quantized layer tested"
    state_e, state_c = eager_ctl.state_dict()["generators"], compiled_ctl.state_dict()["generators"]
    assert state_e.keys() == state_c.keys()
    assert all(torch.equal(state_e[k][role], state_c[k][role]) for k in state_e for role in state_e[k])


@pytest.mark.parametrize("preset", ["nvfp4", "mxfp4", "fp8_tensorwise", "fp8_blockwise"])
def test_no_graph_break_at_quantized_linears(preset):
    """Each quantized linear is three custom ops (Fprop here; Dgrad/Wgrad in the backward graph):
    dynamo traces the whole model into one graph."""
    policy = load_preset(preset)
    model = Stack(build_linear_factory(policy, N_BLOCKS, seed=3))
    PrecisionController(policy, model)
    assert any(not layer.recipe.all_bf16 for layer in model.fc1)
    x = torch.randn(64, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    ops = [node.target for graph in explanation.graphs for node in graph.graph.nodes if node.op == "call_function"]
    quantized = sum(not layer.recipe.all_bf16 for layer in [*model.fc1, *model.fc2])
    assert (
        sum(
            op is torch.ops.nvfp4train.quant_linear_fprop.default or op is torch.ops.nvfp4train.quant_linear_fprop
            for op in ops
        )
        == quantized
    )


def test_small_hybrid_lm_compiles_in_one_graph_with_eager_bits():
    """Mamba, attention and MLP blocks with NVFP4 linears: one graph, eager's loss and gradients."""
    from nvfp4train.model import build_model

    policy = load_preset("nvfp4", bf16_first=0, bf16_last=0)
    tokens = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    results = []
    for compile_model in (False, True):
        torch.manual_seed(0)
        model = build_model({"pattern": "M*-", "d_model": 64}, layer_factory=build_linear_factory(policy, 3, seed=1))
        ctl = PrecisionController(policy, model)
        assert all(not layer.recipe.all_bf16 for layer in ctl.layers)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        forward = torch.compile(model, backend="aot_eager") if compile_model else model
        ctl.on_step(0.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(tokens).float().square().mean()
        loss.backward()
        if compile_model:
            counters = torch._dynamo.utils.counters
            assert not counters["graph_break"], dict(counters["graph_break"])
            assert counters["stats"]["unique_graphs"] == 1
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_e, grads_e), (loss_c, grads_c) = results
    assert torch.equal(loss_e, loss_c)
    # From the last block back to the Mamba block's output the gradients are eager's bit for bit;
    # the Mamba block's own backward (scan, conv, softplus) differs in the last bits under
    # AOTAutograd's decompositions, with or without quantized linears (the bf16 policy too).
    names = [name for name, _ in model.named_parameters()]
    after_mamba = [i for i, name in enumerate(names) if name.startswith(("blocks.1.", "blocks.2."))]
    assert after_mamba and all(torch.equal(grads_e[i], grads_c[i]) for i in after_mamba)
