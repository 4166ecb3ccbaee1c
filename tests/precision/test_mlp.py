"""The FP8 MLP as one node (`precision.mlp.squared_relu_mlp`, the quantizers applying relu² and its derivative as
they read their inputs) gives the separate layers' output and gradients bit for bit: eager and compiled, on CPU
(the reference quantizers, the activation written out) and on a GPU (the Triton prologue)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nvfp4train.model.blocks import MLP, build_mlp
from nvfp4train.model.config import ModelConfig
from nvfp4train.precision import PrecisionController, build_linear_factory
from nvfp4train.precision.mlp import SquaredReLUMLP, fuses_squared_relu, squared_relu_mlp

from .helpers import load_preset

N_BLOCKS, BLOCK = 4, 1  # the FP8 presets keep the first block and the last two in BF16: block 1 is quantized


def make_mlp(preset: str, device: str, d=128, hidden=256, backend=None):
    overrides = {} if backend is None else {"backend": backend}
    policy = load_preset(preset, **overrides)
    cfg = ModelConfig(d_model=d, ffn_hidden=hidden)
    torch.manual_seed(0)
    mlp = build_mlp(cfg, BLOCK, build_linear_factory(policy, N_BLOCKS, seed=3)).to(device)  # as the model builds it
    with torch.no_grad():
        for fc in (mlp.fc1, mlp.fc2):
            fc.weight.normal_(0, 0.05, generator=torch.Generator(device).manual_seed(fc.in_features))
    PrecisionController(policy, mlp)  # enables the weight cache, as in training
    return mlp


def separate(mlp, x):
    return mlp.fc2(F.relu(mlp.fc1(x)).square())


def forward(mlp, x):  # the MLP module the model holds (the factory's SquaredReLUMLP)
    return mlp(x)


def run(forward, mlp, x, dy, autocast: bool):
    mlp.zero_grad()
    x = x.clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        y = forward(mlp, x)
    y.backward(dy)
    return [y.detach(), x.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad]


def assert_same_bits(got, want):
    for name, g, w in zip(("y", "dx", "dW1", "dW2"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g.view(torch.int16 if g.element_size() == 2 else torch.int32), w.view(w_bits(w))), (
            f"{name}: {int((g != w).sum())} of {g.numel()} differ"
        )


def w_bits(t):
    return torch.int16 if t.element_size() == 2 else torch.int32


def inputs(device, tokens=256, d=128, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, tokens // 2, d, generator=g) * 2).to(device, dtype)
    dy = (torch.randn(2, tokens // 2, d, generator=g) * 1e-2).to(device, torch.bfloat16)
    return x, dy


def test_fuses_for_the_fp8_presets_only():
    for preset, fused in (("fp8_blockwise", True), ("fp8_tensorwise", True), ("nvfp4", False), ("bf16", False)):
        mlp = make_mlp(preset, "cpu")
        assert fuses_squared_relu(mlp.fc1, mlp.fc2) == fused, preset
        assert type(mlp) is (SquaredReLUMLP if fused else MLP), preset  # the factory's own MLP where it fuses
    # the first block stays BF16 in the FP8 presets: the factory leaves it to the model's MLP
    factory = build_linear_factory(load_preset("fp8_blockwise"), N_BLOCKS, seed=3)
    assert factory.mlp(128, 256, block_index=0) is None
    first = MLP(ModelConfig(d_model=128, ffn_hidden=256), 0, factory)
    assert not fuses_squared_relu(first.fc1, first.fc2)


def test_the_factory_mlp_runs_its_layers_one_by_one_after_a_switch():
    """A full switch to BF16 makes both layers BF16: the node no longer applies, the layers run as the model's MLP
    would run them."""
    policy = load_preset("fp8_blockwise", switch={"at_fraction": 0.5, "mode": "full"})
    mlp = build_mlp(ModelConfig(d_model=128, ffn_hidden=256), BLOCK, build_linear_factory(policy, N_BLOCKS, seed=3))
    ctl = PrecisionController(policy, mlp)
    assert isinstance(mlp, SquaredReLUMLP) and fuses_squared_relu(mlp.fc1, mlp.fc2)
    ctl.on_step(0.6)
    assert not fuses_squared_relu(mlp.fc1, mlp.fc2)
    x, dy = inputs("cpu")
    assert_same_bits(run(forward, mlp, x, dy, autocast=True), run(separate, mlp, x, dy, autocast=True))


@pytest.mark.parametrize("preset", ["fp8_blockwise", "fp8_tensorwise"])
@pytest.mark.parametrize("tokens", [256, 200])  # 200: no 128-token blocks, the quantizers run one by one
def test_one_node_gives_the_separate_layers_bits_on_cpu(preset, tokens):
    mlp = make_mlp(preset, "cpu")
    x, dy = inputs("cpu", tokens)
    want = run(separate, mlp, x, dy, autocast=False)
    got = run(lambda m, t: squared_relu_mlp(m.fc1, m.fc2, t), mlp, x, dy, autocast=False)
    assert_same_bits(got, want)
    assert_same_bits(run(forward, mlp, x, dy, autocast=False), want)  # the model's MLP takes the node
    # an FP32 input under autocast, and no gradient for x (a frozen embedding upstream)
    x32 = x.float()
    want = run(separate, mlp, x32, dy, autocast=True)
    assert_same_bits(run(forward, mlp, x32, dy, autocast=True), want)
    mlp.zero_grad()
    squared_relu_mlp(mlp.fc1, mlp.fc2, x).backward(dy)
    w1 = mlp.fc1.weight.grad.clone()
    mlp.zero_grad()
    separate(mlp, x).backward(dy)
    assert torch.equal(w1, mlp.fc1.weight.grad)


def test_a_prologue_op_alone_differentiates_through_the_activation():
    """quant_linear_fprop with x_prologue through its registered autograd: dX is x's gradient (the activation's
    derivative applied), as the separate activation and layer give it."""
    from nvfp4train.precision import ops

    mlp = make_mlp("fp8_blockwise", "cpu")
    fc2 = mlp.fc2
    g = torch.Generator().manual_seed(4)
    a = torch.randn(256, 256, generator=g).bfloat16()
    dy = torch.randn(256, 128, generator=g).bfloat16()

    def fused(t):
        return ops.quant_linear_fprop(
            t, fc2.weight, fc2.layer_id, fc2.recipe_key, "emulated", t.dtype, True, True, False, "squared_relu"
        )[0]

    results = []
    for forward in (fused, lambda t: fc2(F.relu(t).square())):
        fc2.zero_grad()
        t = a.clone().requires_grad_()
        y = forward(t)
        y.backward(dy)
        results.append([y.detach(), t.grad, fc2.weight.grad])
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_compiled_one_node_gives_the_separate_layers_bits():
    """torch.compile traces the node (an autograd.Function around the layers' custom ops) without a graph break;
    against the separate layers compiled the same way."""
    mlp = make_mlp("fp8_blockwise", "cpu")
    x, dy = inputs("cpu")
    torch._dynamo.reset()
    try:
        fused = torch.compile(SquaredReLUMLP.forward, backend="aot_eager", fullgraph=True)
        want = run(separate, mlp, x, dy, autocast=False)
        assert_same_bits(run(fused, mlp, x, dy, autocast=False), want)
    finally:
        torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("preset", "backend"),
    [("fp8_blockwise", "emulated"), ("fp8_blockwise", "scaled_mm"), ("fp8_tensorwise", "scaled_mm")],
)
def test_one_node_gives_the_separate_layers_bits_on_cuda(preset, backend):
    """The Triton prologue (relu² forward, its derivative backward) against the layers and the compiled
    activation, eager and under torch.compile (inductor), at a width with 128-token blocks."""
    mlp = make_mlp(preset, "cuda", d=256, hidden=1024, backend=backend)
    assert fuses_squared_relu(mlp.fc1, mlp.fc2)
    x, dy = inputs("cuda", tokens=512, d=256)
    want = run(separate, mlp, x, dy, autocast=True)
    assert_same_bits(run(forward, mlp, x, dy, autocast=True), want)
    torch._dynamo.reset()
    try:
        want = run(torch.compile(separate), mlp, x, dy, autocast=True)
        assert_same_bits(run(torch.compile(SquaredReLUMLP.forward), mlp, x, dy, autocast=True), want)
    finally:
        torch._dynamo.reset()
