import math
from collections import Counter

import numpy as np
import pytest
import torch

from nvfp4train.data import build_train_loader, build_val_data
from nvfp4train.data.blend import BlendSchedule
from nvfp4train.data.config import parse_data_config


def make(cfg, **kw):
    args = dict(seq_len=32, global_batch_size=8, micro_batch_size=2, rank=0, world_size=1, seed=7, total_samples=400)
    args.update(kw)
    return build_train_loader(cfg, **args)


def global_batches(cfg, steps, world_size, micro, **kw):
    """Rows of every global step, ranks concatenated in rank order."""
    loaders = [make(cfg, rank=r, world_size=world_size, micro_batch_size=micro, **kw) for r in range(world_size)]
    out = []
    for _ in range(steps):
        rows = []
        for loader in loaders:
            for _ in range(loader.grad_accum):
                x, y = loader.next_microbatch()
                rows.append(torch.cat([x, y[:, -1:]], dim=1))
        out.append(torch.cat(rows))
    return out


def test_microbatch_shapes_and_shift(corpus, tokenizer, source_of):
    loader = make(corpus)
    x, y = loader.next_microbatch()
    assert x.shape == y.shape == (2, 32) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert loader.tokenizer.identity == tokenizer.identity
    assert int(x.max()) < tokenizer.vocab_size


def test_blend_proportions_match_weights():
    cfg = parse_data_config(
        {
            "tokenizer": "bpe8k",
            "sources": {n: {"train": "x"} for n in "abcd"},
            "phases": [{"start": 0, "weights": {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}}],
        }
    )
    schedule = BlendSchedule(cfg.phases, list("abcd"), total_samples=100_000, seed=3)
    for n in (100, 1_000, 20_000):
        counts = schedule.counts_before(n)[0]
        expected = np.array([0.5, 0.3, 0.15, 0.05]) * n
        # Low-discrepancy assignment: a handful of samples off at most, at every prefix length
        # (independent draws would be off by ~sqrt(n) = 140 at n = 20000).
        assert np.abs(counts - expected).max() <= 4, (n, counts)
    # Not periodic: the order of sources differs between seeds and looks mixed.
    a = BlendSchedule(cfg.phases, list("abcd"), 100_000, seed=3).sources_of(np.arange(64))
    b = BlendSchedule(cfg.phases, list("abcd"), 100_000, seed=4).sources_of(np.arange(64))
    assert not np.array_equal(a, b)


def test_loader_rows_come_from_sources_in_proportion(corpus, tokenizer, source_of):
    loader = make(corpus, global_batch_size=20, micro_batch_size=10, total_samples=10_000)
    seen = Counter()
    for _ in range(20):  # 200 samples, all in phase 0
        x, y = loader.next_microbatch()
        for row in torch.cat([x, y[:, -1:]], 1):
            seen[source_of(row)] += 1
    for name, weight in {"lower": 0.5, "digits": 0.3, "upper": 0.2}.items():
        assert abs(seen[name] - weight * 200) <= 4, seen
    stats = loader.stats()
    # Exact accounting: the logged token counts are what was served.
    assert stats["data/consumed_samples"] == 200
    for name in seen:
        assert stats[f"data/tokens/{name}"] == seen[name] * 32
        assert stats[f"data/phase0/tokens/{name}"] == seen[name] * 32
    assert stats["data/phase0/tokens"] == 200 * 32 and stats["data/phase1/tokens"] == 0


@pytest.mark.parametrize("total_samples", [100, 33])
def test_phase_switch_happens_at_the_right_token(corpus, tokenizer, source_of, total_samples):
    corpus["phases"] = [
        {"start": 0.0, "weights": {"lower": 1}},
        {"start": 0.7, "weights": {"digits": 1}},
        {"start": 0.9, "weights": {"upper": 1}},
    ]
    seq_len = 32
    loader = make(corpus, global_batch_size=1, micro_batch_size=1, total_samples=total_samples, seq_len=seq_len)
    total_tokens = total_samples * seq_len
    sources = []
    for _ in range(total_samples + 3):
        x, y = loader.next_microbatch()
        sources.append(source_of(torch.cat([x[0], y[0, -1:]])))
    # Sample i trains on target tokens [i*L, (i+1)*L): a phase starts with the first sample whose
    # tokens all lie at or after start * total_tokens.
    for name, start in (("digits", 0.7), ("upper", 0.9)):
        first = sources.index(name)
        assert first * seq_len >= start * total_tokens > (first - 1) * seq_len
    assert set(sources[: sources.index("digits")]) == {"lower"}
    assert sources[-1] == "upper"  # past total_samples the last phase continues
    stats = loader.stats()
    assert stats["data/phase"] == 2
    assert stats["data/phase1/tokens"] == sources.count("digits") * seq_len


def test_resume_is_exact_also_across_phase_boundaries(corpus):
    kw = dict(global_batch_size=8, micro_batch_size=2, total_samples=80)  # phases at steps 7 and 9
    reference = make(corpus, **kw)
    expected = [reference.next_microbatch() for _ in range(4 * 10)]
    for stop in (4 * 6, 4 * 6 + 1, 4 * 7 + 3, 4 * 9):  # before, mid-step, inside phase 1, at phase 2
        first = make(corpus, **kw)
        for _ in range(stop):
            first.next_microbatch()
        state = first.state_dict()
        import json

        state = json.loads(json.dumps(state))  # what goes into a checkpoint
        resumed = make(corpus, **kw)
        resumed.load_state_dict(state)
        for i in range(stop, len(expected)):
            x, y = resumed.next_microbatch()
            assert torch.equal(x, expected[i][0]) and torch.equal(y, expected[i][1]), (stop, i)
        assert resumed.stats() == reference.stats()


def test_same_global_batches_for_any_world_size_and_ranks_disjoint(corpus):
    kw = dict(global_batch_size=8, total_samples=64)
    single = global_batches(corpus, 8, world_size=1, micro=8, **kw)
    for world_size, micro in ((2, 2), (4, 1), (8, 1), (2, 4)):
        assert all(torch.equal(a, b) for a, b in zip(single, global_batches(corpus, 8, world_size, micro, **kw)))
    rows = [tuple(r.tolist()) for batch in single for r in batch]
    assert len(set(rows)) == len(rows)  # no sample served twice (so no two ranks share one)


def test_world_size_can_change_at_a_step_boundary_but_not_mid_step(corpus):
    kw = dict(global_batch_size=8, total_samples=64)
    single = global_batches(corpus, 6, world_size=1, micro=8, **kw)
    two = [make(corpus, rank=r, world_size=2, micro_batch_size=2, **kw) for r in range(2)]
    for loader in two:
        for _ in range(2 * 3):  # 3 global steps
            loader.next_microbatch()
    state = two[0].state_dict()
    assert state == two[1].state_dict()  # any rank's state can be saved
    one = make(corpus, world_size=1, micro_batch_size=4, **kw)
    one.load_state_dict(state)
    for step in range(3, 6):
        rows = torch.cat([torch.cat([x, y[:, -1:]], 1) for x, y in (one.next_microbatch(), one.next_microbatch())])
        assert torch.equal(rows, single[step])
    two[0].next_microbatch()
    with pytest.raises(ValueError, match="middle of a global step"):
        make(corpus, world_size=1, micro_batch_size=4, **kw).load_state_dict(two[0].state_dict())


def test_state_from_another_run_is_refused(corpus):
    loader = make(corpus)
    loader.next_microbatch()
    state = loader.state_dict()
    with pytest.raises(ValueError, match="seed"):
        make(corpus, seed=8).load_state_dict(state)
    corpus["phases"][1]["weights"]["lower"] = 0.3
    with pytest.raises(ValueError, match="phases"):
        make(corpus).load_state_dict(state)


def test_exhausted_source_is_reepoched_with_a_fresh_shuffle_and_counted(corpus, tokenizer, caplog):
    caplog.set_level("INFO", logger="nvfp4train.data.loader")
    corpus["phases"] = [{"start": 0.0, "weights": {"upper": 1}}]
    loader = make(corpus, global_batch_size=4, micro_batch_size=4, total_samples=10_000)
    stream = loader.streams["upper"]
    per_epoch, eos = stream.samples_per_epoch, tokenizer.eos_id
    rows = []
    while len(rows) < 2 * per_epoch + 4:
        x, y = loader.next_microbatch()
        rows.extend(torch.cat([x, y[:, -1:]], 1))
    all_docs = {tuple(stream.shards.document(i).tolist()) for i in range(stream.shards.n_docs)}
    orders = []
    for epoch in range(2):
        epoch_rows = rows[epoch * per_epoch : (epoch + 1) * per_epoch]
        # Windows overlap by one token: x of every row plus the last token rebuilds the epoch stream.
        tokens = torch.cat([r[:-1] for r in epoch_rows] + [epoch_rows[-1][-1:]]).tolist()
        docs, current = [], []
        for t in tokens:
            current.append(t)
            if t == eos:
                docs.append(tuple(current))
                current = []
        assert len(set(docs)) == len(docs)  # no document twice in an epoch
        assert set(docs) <= all_docs  # documents intact, EOS-terminated
        assert len(docs) >= len(all_docs) - 6  # all but the cut tail (< seq_len tokens)
        orders.append(docs)
    assert orders[0][:20] != orders[1][:20]  # a fresh shuffle per epoch
    stats = loader.stats()
    assert stats["data/reepochs/upper"] == 2
    assert [r.getMessage() for r in caplog.records if "ran out" in r.getMessage()] == [
        f"data source 'upper' ran out: epoch {e} (fresh shuffle) begins in global step {(e * per_epoch) // 4}"
        for e in (1, 2)
    ]
    assert math.isclose(stats["data/epochs/upper"], len(rows) / per_epoch)


def test_val_data_is_consecutive_windows_of_held_out_documents(corpus, tokenizer, source_of):
    val = build_val_data(corpus, seq_len=16, max_sequences_per_domain=5)
    assert set(val) == {"lower", "digits", "upper"}
    for name, rows in val.items():
        assert rows.dtype == torch.long and rows.shape == (5, 17)
        assert torch.equal(rows[1:, 0], rows[:-1, -1])  # stride seq_len: every token a target once
        assert source_of(rows.flatten()) == name
    big = build_val_data(corpus, seq_len=16, max_sequences_per_domain=10**6)
    assert 5 < big["upper"].shape[0] < 10**6
