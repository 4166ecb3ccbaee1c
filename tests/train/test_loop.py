"""The command line in-process: run()'s summary is what it prints, and the process group the runs
shared is destroyed once they are done (a one-rank gloo group stands in for torchrun's)."""

import signal
import sys

import torch.distributed

from nvfp4train.train.__main__ import main
from tests.conftest import read_metrics


def test_main_prints_the_summary_and_destroys_the_process_group(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "nvfp4train.train",
            f"out_dir={out}",
            "train.max_steps=2",
            "train.eval_sequences=2",
            "train.progress=false",
            "train.seq_len=64",
            "train.global_batch_size=4",
            "train.micro_batch_size=4",
        ],
    )
    # the run installs its preemption handlers: pytest's own come back afterwards
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        main()
        assert not torch.distributed.is_initialized()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    last = [r for r in read_metrics(out) if "loss" in r][-1]  # the very last record is the checkpoint's
    assert (
        f"done: step 2, loss {last['loss']:.4f}, checkpoint {out / 'checkpoints' / 'step_00000002'}"
        in capsys.readouterr().out
    )
