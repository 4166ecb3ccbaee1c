"""The layer-factory protocol the model owns (model/layers.py): the plain factory builds a model that trains, a
factory's `mlp` returning None gives the model's own MLP and a module is used as the block's MLP, a callable of
the old protocol is refused in one line, and the model package imports nothing of the precision package."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nvfp4train.model import LINEAR_NAMES, PLAIN_LAYERS, HybridLM, LayerFactory, ModelConfig, build_model
from nvfp4train.model.blocks import MLP
from nvfp4train.model.config import BLOCK_LINEARS

ROOT = Path(__file__).resolve().parents[2]


def test_the_plain_factory_builds_a_model_whose_loss_falls(small_cfg_dict):
    assert isinstance(PLAIN_LAYERS, LayerFactory)
    torch.manual_seed(0)
    model = build_model(small_cfg_dict)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert set(linears) == {"lm_head", *model.cfg.linear_modules()}
    assert all(m.bias is None for m in linears.values())
    tokens = torch.randint(0, small_cfg_dict["vocab_size"], (2, 17))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):  # one batch, learned by heart
        loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


class CountingMLP(nn.Module):
    """A factory's own MLP: the model's function, its own class."""

    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc2(F.relu(self.fc1(x)).square())


class OwnMLPs:
    """nn.Linear layers, and an MLP of its own for the blocks in `blocks`."""

    def __init__(self, blocks):
        self.blocks, self.asked = set(blocks), []

    def linear(self, in_features, out_features, *, block_index, name, strided_output=False):
        return nn.Linear(in_features, out_features, bias=False)

    def mlp(self, in_features, hidden_features, *, block_index):
        self.asked.append((block_index, in_features, hidden_features))
        if block_index not in self.blocks:
            return None
        fc1 = self.linear(in_features, hidden_features, block_index=block_index, name="fc1")
        fc2 = self.linear(hidden_features, in_features, block_index=block_index, name="fc2")
        return CountingMLP(fc1, fc2)


def test_mlp_none_gives_the_model_s_mlp_and_a_module_is_the_block_s_mlp():
    cfg = ModelConfig.from_dict({"pattern": "-M-*-", "d_model": 64, "vocab_size": 97, "ssd_backend": "torch"})
    factory = OwnMLPs(blocks={2})
    torch.manual_seed(0)
    model = HybridLM(cfg, layer_factory=factory)
    assert factory.asked == [(i, cfg.d_model, cfg.ffn_hidden) for i in (0, 2, 4)]  # once per MLP block
    kinds = {i: type(model.blocks[i].mixer) for i in (0, 2, 4)}
    assert kinds == {0: MLP, 2: CountingMLP, 4: MLP}
    torch.manual_seed(0)
    plain = HybridLM(cfg)
    # the same parameter names, init and outputs as the model's own MLPs: the factory's MLP is the block's mixer
    assert model.state_dict().keys() == plain.state_dict().keys()
    for key, value in plain.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    tokens = torch.randint(0, 97, (2, 9))
    assert torch.equal(model(tokens), plain(tokens))
    assert model.blocks[2].mixer.calls == 1


def test_a_callable_of_the_old_protocol_is_refused_in_one_line(small_cfg_dict):
    def linear_factory(in_features, out_features, *, block_index, name):
        return nn.Linear(in_features, out_features, bias=False)

    with pytest.raises(TypeError, match=r"layer_factory must have linear\(\) and mlp\(\).*got function"):
        build_model(small_cfg_dict, layer_factory=linear_factory)


def test_the_linear_names_are_the_blocks_linears():
    assert sorted(LINEAR_NAMES) == sorted(name for names in BLOCK_LINEARS.values() for name in names)


def test_the_model_package_imports_no_precision_module():
    code = (
        "import sys, nvfp4train.model, nvfp4train.model.decode, nvfp4train.model.layers\n"
        "leaked = sorted(m for m in sys.modules if m.startswith('nvfp4train.precision'))\n"
        "assert not leaked, leaked\n"
        "print(nvfp4train.model.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(ROOT))  # this checkout's model package


@pytest.mark.parametrize("first", ["nvfp4train.precision", "nvfp4train.model", "nvfp4train.train"])
def test_each_package_imports_first_in_a_fresh_interpreter(first):
    """precision implements the model's protocol (it imports model.layers): neither order is a cycle."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", f"import {first}, nvfp4train.precision, nvfp4train.model"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
