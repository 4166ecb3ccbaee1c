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
    ],
)
def test_bad_config_gives_one_clear_line(tmp_path, override, expected):
    out = tmp_path / "run"
    args = [f"out_dir={out}", override] if not override.startswith("out_dir") else [override]
    proc = run_train(*args, check=False, timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for word in expected:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()
