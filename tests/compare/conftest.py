"""Three tiny runs shared by the comparison tests: two seeds of a baseline arm and one other arm."""

import pytest

from tests.conftest import run_train

TINY = [
    "train.max_steps=8",
    "train.seq_len=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
    "train.eval_every=4",
    "train.eval_sequences=2",
    "train.progress=false",
    "optim.schedule.warmup_steps=2",
    "experiment=cmp_test",
]


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    dirs = {"base_s1": root / "base_s1", "base_s2": root / "base_s2", "arm": root / "arm"}
    run_train(f"out_dir={dirs['base_s1']}", "seed=1", *TINY)
    run_train(f"out_dir={dirs['base_s2']}", "seed=2", *TINY)
    run_train(f"out_dir={dirs['arm']}", "seed=1", "optim.lr=0.001", *TINY)
    return dirs
