"""DeepSpeed ZeRO as the alternative engine (CPU, gloo): it trains like the PyTorch engine, and its
checkpoints resume exactly through the same atomic layout (loaded with weights_only=True)."""

import shutil

import pytest

from tests.conftest import read_metrics, run_train

pytest.importorskip("deepspeed")
COMMON = [
    "train.parallel=deepspeed",
    "train.max_steps=8",
    "train.save_every=4",
    "train.log_every=1",
    "train.progress=false",
    "train.global_batch_size=16",
    "train.micro_batch_size=8",
    "train.eval_sequences=2",
]
TORCH_ENGINE = [c for c in COMMON if not c.startswith("train.parallel")]


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    """The same run through the PyTorch engine, trained once for the module (each test copies it before
    writing to it)."""
    out = tmp_path_factory.mktemp("deepspeed") / "torch"
    run_train(f"out_dir={out}", *TORCH_ENGINE)
    return out


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_resume_is_exact_and_matches_torch_engine(tmp_path, stage, torch_run):
    full, cut = tmp_path / "full", tmp_path / "cut"
    run_train(f"out_dir={full}", f"train.zero_stage={stage}", *COMMON)
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "step_00000008")  # as if killed after the step-4 checkpoint
    resumed = run_train(f"out_dir={cut}", f"train.zero_stage={stage}", *COMMON)
    assert "resumed from" in resumed.stdout and "deepspeed" in resumed.stdout
    a = [r["loss"] for r in read_metrics(full) if "loss" in r]  # not the checkpoint records
    b = [r["loss"] for r in read_metrics(cut) if "loss" in r]
    assert len(a) == len(b) == 8 and a == b
    # Same data and init through the PyTorch engine: BF16 weights (DeepSpeed) vs FP32 masters under
    # autocast differ slightly, step by step.
    c = [r["loss"] for r in read_metrics(torch_run) if "loss" in r]
    assert a[0] == pytest.approx(c[0], rel=1e-2)
    assert a[-1] == pytest.approx(c[-1], rel=3e-2) and a[-1] < a[0] - 0.3


def test_torch_checkpoint_is_refused_by_deepspeed_engine(tmp_path, torch_run):
    out = tmp_path / "run"
    shutil.copytree(torch_run, out)
    proc = run_train(f"out_dir={out}", *COMMON, check=False)
    assert proc.returncode == 2
    assert "written by the torch engine" in proc.stderr.strip().splitlines()[-1]
