"""The PyTorch engine's step: gradient accumulation equals one big batch, and a non-finite loss skips
the update (weights untouched), counts it, and halts after K in a row."""
import math

import pytest
import torch
import torch.nn as nn

from nvfp4train.dist import DistInfo
from nvfp4train.optim import OptimConfig
from nvfp4train.train.engines import TorchEngine
from nvfp4train.train.guards import NonFiniteGuard, TrainingHalted

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class TinyLM(nn.Module):
    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("poison", torch.ones(()))  # set to NaN to make the loss non-finite

    def forward(self, tokens):
        return self.head(self.emb(tokens)) * self.poison


def make_engine(max_in_row=3):
    torch.manual_seed(0)
    model = TinyLM()
    engine = TorchEngine(model, lambda m: [{"params": list(m.parameters())}], OptimConfig(lr=1e-2, grad_clip=0.0),
                         "ddp", CPU, NonFiniteGuard(max_in_row))
    return model, engine


def batches(n, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 32, (n * rows, 9), generator=g)
    return [(toks[i * rows:(i + 1) * rows, :-1], toks[i * rows:(i + 1) * rows, 1:]) for i in range(n)]


def test_accumulation_matches_one_big_batch():
    (m1, e1), (m2, e2) = make_engine(), make_engine()
    big = batches(1, 8)
    small = [(big[0][0][i:i + 2], big[0][1][i:i + 2]) for i in range(0, 8, 2)]
    l1, n1, _ = e1.train_step(big, lr=1e-2, step=1)
    l2, n2, _ = e2.train_step(small, lr=1e-2, step=1)
    assert l1 == pytest.approx(l2, rel=1e-5) and n1 == pytest.approx(n2, rel=1e-4)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # Adam divides by tiny sqrt(v)


def test_nonfinite_step_is_skipped_then_halts():
    model, engine = make_engine(max_in_row=2)
    engine.train_step(batches(1, 4), lr=1e-2, step=1)
    before = [p.detach().clone() for p in model.parameters()]
    model.poison.fill_(math.nan)
    loss, _, applied = engine.train_step(batches(1, 4, seed=1), lr=1e-2, step=2)
    assert math.isnan(loss) and not applied and engine.guard.total_skipped == 1
    for p, q in zip(before, model.parameters()):
        assert torch.equal(p, q)                                   # no update from the bad step
    assert all(p.grad is None for p in model.parameters())        # nor leftover gradients
    with pytest.raises(TrainingHalted, match="2 steps in a row"):
        engine.train_step(batches(1, 4, seed=2), lr=1e-2, step=3)
    model.poison.fill_(1.0)
