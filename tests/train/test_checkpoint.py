import os
import pickle

import pytest
import torch
import torch.nn as nn

from nvfp4train.train import checkpoint
from torch.distributed.checkpoint.api import CheckpointException

from nvfp4train.train.checkpoint import CheckpointError

MODEL_CFG = {"name": "toy", "d_model": 8}


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def make(seed=0):
    torch.manual_seed(seed)
    model = Toy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    return model, opt


def train_steps(model, opt, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        loss = model(torch.randn(4, 8, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def save(root, step, model, opt, keep_last=3, state=None):
    return checkpoint.save(root, step, model, opt, rank=0, world_size=1, meta={"model_config": MODEL_CFG},
                           trainer_state=state or {"loader": {"consumed": step}}, keep_last=keep_last,
                           barrier=lambda: None)


def test_roundtrip_restores_weights_and_optimizer_exactly(tmp_path):
    model, opt = make()
    train_steps(model, opt, 3)
    path = save(tmp_path, 3, model, opt, state={"loader": {"consumed": 3}, "rng": torch.get_rng_state()})
    model2, opt2 = make(seed=5)
    meta, state = checkpoint.load(path, model2, opt2, rank=0, model_config=MODEL_CFG)
    assert meta["step"] == 3 and state["loader"] == {"consumed": 3}
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95)
    # continuing both gives bit-identical weights
    train_steps(model, opt, 2, seed=7)
    train_steps(model2, opt2, 2, seed=7)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_keep_last_k_and_ignore_unfinished(tmp_path):
    model, opt = make()
    for step in (1, 2, 3, 4):
        save(tmp_path, step, model, opt, keep_last=2)
    (tmp_path / "step_00000005.tmp").mkdir()  # a save that crashed half-way
    names = [p.name for p in checkpoint.list_checkpoints(tmp_path)]
    assert names == ["step_00000003", "step_00000004"]


def test_crash_mid_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    model, opt = make()
    save(tmp_path, 1, model, opt)
    real_save = torch.save

    def dying_save(obj, f, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises((OSError, CheckpointException)):
        save(tmp_path, 2, model, opt)
    monkeypatch.setattr(torch, "save", real_save)
    latest = checkpoint.list_checkpoints(tmp_path)[-1]
    assert latest.name == "step_00000001"
    checkpoint.load(latest, *make(), rank=0, model_config=MODEL_CFG)


def test_other_model_config_is_refused_by_name(tmp_path):
    model, opt = make()
    path = save(tmp_path, 1, model, opt)
    with pytest.raises(CheckpointError, match=r"d_model \(8 in the checkpoint, 16 now\)"):
        checkpoint.load(path, *make(), rank=0, model_config={"name": "toy", "d_model": 16})


def test_metadata_with_foreign_objects_is_not_unpickled(tmp_path):
    model, opt = make()
    path = save(tmp_path, 1, model, opt)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (path / "model_optim" / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="not allowed"):
        checkpoint.load(path, *make(), rank=0, model_config=MODEL_CFG)
    assert not (tmp_path / "pwned").exists()
