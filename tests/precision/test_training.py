"""A short CPU training run per policy: a small MLP stack of factory-built linears learns a fixed
synthetic task (a random teacher network's classes); every policy stays finite and ends within a
few percent of BF16's loss. The integrator adds the end-to-end run with the real model.

The stack has no residual connections on purpose: every gradient below the top block must pass
through the quantized Dgrad GEMMs, so a broken Dgrad (or Wgrad) stops the run from learning
(checked by hand: zeroing Dgrad leaves the loss at its start, negating Wgrad too)."""

import pytest
import torch
from torch import nn

from nvfp4train.precision import PrecisionController, build_linear_factory

from .helpers import PRESETS, load_preset

pytestmark = [
    pytest.mark.integration,  # a 60-step training run per preset: not the quick loop
    # RMSNorm gets BF16 activations and an FP32 weight under autocast; torch warns it cannot fuse that.
    pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight"),
]

D, HIDDEN, CLASSES, N_BLOCKS, STEPS, BATCH = 64, 128, 16, 4, 60, 256


class Student(nn.Module):
    """Embedding-like input projection and head stay high precision (BF16 autocast), like the model."""

    def __init__(self, factory):
        super().__init__()
        self.inp = nn.Linear(32, D, bias=False)
        self.norms = nn.ModuleList(nn.RMSNorm(D) for _ in range(N_BLOCKS))
        self.fc1 = nn.ModuleList(factory.linear(D, HIDDEN, block_index=i, name="fc1") for i in range(N_BLOCKS))
        self.fc2 = nn.ModuleList(factory.linear(HIDDEN, D, block_index=i, name="fc2") for i in range(N_BLOCKS))
        self.head = nn.Linear(D, CLASSES, bias=False)

    def forward(self, x):
        h = self.inp(x)
        for norm, fc1, fc2 in zip(self.norms, self.fc1, self.fc2):
            h = fc2(torch.relu(fc1(norm(h))).square())  # squared ReLU, as the paper's FFN
        return self.head(h)


def task_batches():
    g = torch.Generator().manual_seed(0)
    teacher1, teacher2 = torch.randn(32, 64, generator=g), torch.randn(64, CLASSES, generator=g)
    for _ in range(STEPS):
        x = torch.randn(BATCH, 32, generator=g)
        yield x, (torch.tanh(x @ teacher1) @ teacher2).argmax(-1)


def train(preset: str, **overrides) -> list[float]:
    policy = load_preset(preset, **overrides)
    torch.manual_seed(0)
    model = Student(build_linear_factory(policy, N_BLOCKS, seed=0))
    for fc in list(model.fc1) + list(model.fc2):  # small init, like the model's
        nn.init.normal_(fc.weight, std=0.05)
    ctl = PrecisionController(policy, model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for i, (x, target) in enumerate(task_batches()):
        ctl.on_step(i / STEPS)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def bf16_losses():
    return train("bf16")


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "bf16"])
def test_short_training_run_tracks_bf16(preset, bf16_losses):
    losses = train(preset)
    assert all(torch.isfinite(torch.tensor(losses)))
    final, final_bf16 = sum(losses[-10:]) / 10, sum(bf16_losses[-10:]) / 10
    assert final < 0.8 * losses[0], "the run must learn"
    assert abs(final - final_bf16) / final_bf16 < 0.05, (final, final_bf16)


@pytest.fixture(scope="module")
def nvfp4_losses():
    return train("nvfp4")


@pytest.mark.parametrize("preset", ["nvfp4_4over6", "nvfp4_row_scaled"])
def test_te_option_presets_train_and_change_the_numbers(preset, nvfp4_losses):
    """TE's 4over6 / row-scaled presets reach the quantizers: finite losses, different from nvfp4's."""
    losses = train(preset)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses != nvfp4_losses
