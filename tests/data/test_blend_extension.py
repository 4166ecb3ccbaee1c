"""Extending a run on resume (a larger train.max_steps, so more total samples) keeps the source of every
sample already drawn: phases already reached keep their start, later ones move to their fraction of the
new total (data/blend.py, replan_starts)."""

import json

import numpy as np
import pytest
import torch

from nvfp4train.data import build_train_loader

GLOBAL = 8


def make(cfg, total_samples):
    return build_train_loader(
        cfg,
        seq_len=32,
        global_batch_size=GLOBAL,
        micro_batch_size=GLOBAL,
        rank=0,
        world_size=1,
        seed=7,
        total_samples=total_samples,
    )


def steps(loader, n):
    """The next n global steps' rows (one micro-batch per step here)."""
    return [torch.cat([x, y[:, -1:]], 1) for x, y in (loader.next_microbatch() for _ in range(n))]


def saved_after(cfg, total_samples, n_steps):
    loader = make(cfg, total_samples)
    steps(loader, n_steps)
    return loader, json.loads(json.dumps(loader.state_dict()))  # what goes into a checkpoint


def test_extension_past_a_phase_boundary_keeps_history_and_continues_in_order(corpus):
    short, state = saved_after(corpus, 80, 8)  # phases start at samples 56 and 72; 64 drawn: phase 1
    assert state["phase_starts"] == [0, 56, 72]
    longer = make(corpus, 160)
    longer.load_state_dict(state)
    assert longer.schedule.phase_starts.tolist() == [0, 56, 144]  # phase 2 at 0.9 of the new total
    drawn = np.arange(64)
    assert np.array_equal(longer.schedule.sources_of(drawn), short.schedule.sources_of(drawn))
    # step 9 lies in phase 1 under both plans: the extended run draws exactly what the short one would
    assert torch.equal(steps(longer, 1)[0], steps(short, 1)[0])
    # the extended run's own checkpoint resumes exactly, with the replanned starts
    again = make(corpus, 160)
    again.load_state_dict(json.loads(json.dumps(longer.state_dict())))
    assert again.schedule.phase_starts.tolist() == [0, 56, 144]
    assert all(torch.equal(a, b) for a, b in zip(steps(again, 10), steps(longer, 10)))


def test_extension_inside_the_first_phase_is_the_longer_plan_from_the_start(corpus):
    _, state = saved_after(corpus, 80, 4)  # 32 samples drawn, phase 1 not reached
    longer = make(corpus, 160)
    longer.load_state_dict(state)
    planned = make(corpus, 160)  # a run planned for 160 samples from its first step
    steps(planned, 4)
    assert longer.schedule.phase_starts.tolist() == [0, 112, 144]
    assert all(torch.equal(a, b) for a, b in zip(steps(longer, 16), steps(planned, 16)))


def test_extending_a_finished_run_continues_in_its_last_phase(corpus):
    _, state = saved_after(corpus, 80, 10)
    longer = make(corpus, 160)
    longer.load_state_dict(state)
    assert longer.schedule.phase_starts.tolist() == [0, 56, 72]
    assert set(longer.schedule.phase_of(np.arange(80, 160)).tolist()) == {2}
    steps(longer, 10)
    assert longer.stats()["data/phase"] == 2


def test_a_state_without_phase_starts_is_extended_only_where_history_is_unchanged(corpus):
    """States written before phase starts were saved: the per-source counts decide, as they did."""
    _, early = saved_after(corpus, 80, 4)
    _, late = saved_after(corpus, 80, 8)
    for state in (early, late):
        del state["phase_starts"]
    make(corpus, 160).load_state_dict(early)
    with pytest.raises(ValueError, match="resume with the original max_steps"):
        make(corpus, 160).load_state_dict(late)


def test_cli_extends_a_finished_run_past_its_phase_boundaries(tmp_path):
    """Through the trainer: the checkpoint carries the phase starts, a longer max_steps continues."""
    from tests.conftest import read_metrics, run_train

    out = tmp_path / "run"
    args = [
        f"out_dir={out}",
        "train.progress=false",
        "train.eval_sequences=2",
        "train.seq_len=32",
        "train.global_batch_size=4",
        "train.log_every=1",
    ]
    run_train(*args, "train.max_steps=5")  # phases start at samples 14 and 18: in steps 4 and 5
    first = read_metrics(out)
    proc = run_train(*args, "train.max_steps=7")
    assert "resume changes train.max_steps: 5 -> 7" in proc.stdout
    records = read_metrics(out)
    assert records[: len(first)] == first and [r["step"] for r in records[len(first) :]] == [6, 7]
    assert {r["data/phase"] for r in records[len(first) :]} == {2}  # the last phase runs on
