"""One tiny trained run shared by the eval and export tests (a few seconds on 2 cores)."""

import pytest

from tests.conftest import run_train

TINY = [
    "train.max_steps=4",
    "train.seq_len=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
    "train.eval_sequences=2",
    "train.progress=false",
]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    run_train(f"out_dir={out}", *TINY)
    return out
