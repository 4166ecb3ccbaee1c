import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

from nvfp4train.optim import OptimConfig
from nvfp4train.parallel import DistInfo
from nvfp4train.train import checkpoint
from nvfp4train.train.checkpoint import CheckpointError
from nvfp4train.train.engines import TorchEngine
from tests.conftest import cli_env

MODEL_CFG = {"name": "toy", "d_model": 8}


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def make(seed=0):
    """A real single-process engine (FP32 weights, AdamW) around a small model."""
    torch.manual_seed(seed)
    model = Toy()
    engine = TorchEngine(
        model,
        lambda m: [{"params": list(m.parameters())}],
        OptimConfig(lr=1e-2),
        "ddp",
        DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")),
    )
    return model, engine


def train_steps(model, engine, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        loss = model(torch.randn(4, 8, generator=g)).square().mean()
        loss.backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad()


def rank_state(step):
    """A rank file's trainer state as the trainer writes it (checkpoint.RANK_FIELDS)."""
    return {"loader": {"consumed": step}, "precision": {}, "guard": {}, "spikes": {}, "rng_cpu": torch.get_rng_state()}


def save(root, step, model, engine, keep_last=3, state=None):
    return checkpoint.save(
        root,
        step,
        engine,
        rank=0,
        world_size=1,
        meta={"model_config": MODEL_CFG},
        trainer_state=state or rank_state(step),
        keep_last=keep_last,
        barrier=lambda: None,
    )


def load(path, engine, model_config=MODEL_CFG):
    return checkpoint.load(path, engine, rank=0, model_config=model_config)


def test_roundtrip_restores_weights_and_optimizer_exactly(tmp_path):
    model, opt = make()
    train_steps(model, opt, 3)
    path = save(tmp_path, 3, model, opt)
    model2, opt2 = make(seed=5)
    meta, state = load(path, opt2)
    assert meta["step"] == 3 and state["loader"] == {"consumed": 3}
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert opt2.optimizer.param_groups[0]["betas"] == (0.9, 0.95)
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
    with pytest.raises(
        CheckpointError,
        match=r"step_00000002: cannot write the checkpoint \(disk full\); "
        r".*step_00000001 is intact",
    ):
        save(tmp_path, 2, model, opt)
    assert not (tmp_path / "step_00000002.tmp").exists()
    monkeypatch.setattr(torch, "save", real_save)
    latest = checkpoint.list_checkpoints(tmp_path)[-1]
    assert latest.name == "step_00000001"
    load(latest, make()[1])


def test_other_model_config_is_refused_by_name(tmp_path):
    model, opt = make()
    path = save(tmp_path, 1, model, opt)
    with pytest.raises(CheckpointError, match=r"d_model \(8 in the checkpoint, 16 now\)"):
        load(path, make()[1], model_config={"name": "toy", "d_model": 16})


def test_metadata_with_foreign_objects_is_not_unpickled(tmp_path):
    model, opt = make()
    path = save(tmp_path, 1, model, opt)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (path / "model_optim" / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="not allowed"):
        load(path, make()[1])
    assert not (tmp_path / "pwned").exists()


def test_single_process_warning_is_silenced_only_inside_checkpointing(tmp_path):
    """DCP warns that no process group exists on every single-process save/load; checkpoint.py hides
    that warning around its own DCP calls and leaves the program's warning filters as they were."""
    message = "torch.distributed is disabled, unavailable or uninitialized"
    probe = (
        "import warnings, nvfp4train.train.checkpoint; "
        f"assert not (m := [f for f in warnings.filters if f[1] and f[1].match({message!r})]), m"
    )
    proc = subprocess.run([sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]  # importing installs no global filter
    model, opt = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(save(tmp_path, 1, model, opt), make()[1])
        warnings.warn(message + " (from elsewhere)", stacklevel=2)
    assert [str(w.message) for w in caught if message in str(w.message)] == [message + " (from elsewhere)"]
