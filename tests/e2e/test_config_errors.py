"""A wrong key or value: one line naming it and what is allowed, exit code != 0, nothing written."""

import pytest

from tests.conftest import run_train


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.max_stepz=5", ["train.max_stepz", "unknown key", "max_steps"]),
        ("precision=bf17", ["precision=bf17", "allowed", "bf16"]),
        ("model=hybrid_huge", ["model=hybrid_huge", "allowed", "hybrid_tiny"]),
        ("train.max_steps=-3", ["train.max_steps=-3", "positive integer"]),
        ("train.resume=/no/such/ckpt", ["train.resume", "not a checkpoint directory"]),
        ("train.parallel=zero3", ["train.parallel='zero3'", "ddp"]),
        ("optim.schedule.decay_style=quadratic", ["decay_style", "minus_sqrt"]),
        ("model.pattern=MMXM", ["pattern"]),
        ("out_dir=/proc/nope/run", ["out_dir", "not writable"]),
        # Hydra's delete of a whole section would drop the train.* overrides and train on the defaults
        ("~train", ["~train", "deleting the whole train section is not allowed"]),
        ("~optim.schedule", ["~optim.schedule", "optim.schedule.warmup_steps=1"]),
        ("train.max_steps=${nope}", ["train.max_steps", "does not resolve", "'nope' not found"]),
        ("out_dir=${oc.env:NVFP4TRAIN_UNSET_VAR}", ["out_dir", "does not resolve", "NVFP4TRAIN_UNSET_VAR"]),
        ("train.max_steps=99999999999999999999999", ["train.max_steps=9999", "at most 2**63-1"]),
        ("seed=99999999999999999999999", ["seed=9999", "at most 2**63-1"]),
        ("seed=1e400", ["seed", "expected int"]),
        ("train.max_steps=999999999999999999", ["train.max_steps", "2.05e+21 training tokens", "2**63-1"]),
        # sizes checked before anything is allocated: a stated bound, and a lower bound of the memory
        ("train.global_batch_size=100000000", ["train.global_batch_size=100000000", "1.28e+10 tokens a step"]),
        ("train.seq_len=100000000", ["train.seq_len=100000000", "GiB of activations", "the run needs at least"]),
        ("model.d_model=1000000", ["model: 12,145,127,376,280 parameters", "the run needs at least", "GiB"]),
        ("out_dir=runs/ünï", ["out_dir=runs/ünï", "must be quoted", "\"out_dir='runs/ünï'\""]),
    ],
)
def test_bad_config_gives_one_clear_line(tmp_path, override, expected):
    out = tmp_path / "run"
    args = [f"out_dir={out}", override] if not override.startswith("out_dir") else [override]
    args += ["train.max_steps=3", "optim.schedule.warmup_steps=1"] if override.startswith("~") else []
    proc = run_train(*args, check=False, timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for word in expected:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()


def test_a_non_ascii_out_dir_trains_when_quoted(tmp_path):
    out = tmp_path / "ünï"
    args = ["train.max_steps=2", "train.seq_len=32", "train.global_batch_size=2", "train.eval_sequences=1"]
    proc = run_train(f"out_dir='{out}'", *args, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out / "checkpoints" / "step_00000002").is_dir() and f"out_dir: {out}" in (out / "config.yaml").read_text()
