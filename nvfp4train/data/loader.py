"""Deterministic, resumable, phased blend of token shards -> packed (x, y) micro-batches.

The stream is a pure function of (seed, global sample index):
  * blend.BlendSchedule says which phase and source global sample i comes from;
  * sample i is the k-th sample ever drawn from that source (k = how many earlier global samples
    chose it), and a source's k-th sample is a window of seq_len + 1 tokens at offset
    (k mod samples_per_epoch) * seq_len in that source's epoch-(k div samples_per_epoch) token
    stream: its documents (each ending in EOS) concatenated in an order shuffled per epoch.
    Consecutive windows overlap by one token, so every token is a target exactly once per epoch
    (the tail that does not fill a window is skipped). Running out means a new epoch with a fresh
    shuffle, counted in stats().
One global step is global samples [step * G, (step + 1) * G). Rank r takes the contiguous block
[r * G / W, (r + 1) * G / W) of it, in micro-batches of micro_batch_size: the union over ranks is
the same for every world size, and no two ranks share a sample.
"""

from __future__ import annotations

import logging
import zlib

import numpy as np
import torch

from .blend import BlendSchedule, replan_starts
from .config import DataConfig, parse_data_config
from .shards import TokenShards
from .tokenizer import load_tokenizer

log = logging.getLogger(__name__)
STATE_VERSION = "nvfp4train.data.loader/1"


class SourceStream:
    """The samples of one source, epoch after epoch, each epoch a fresh document shuffle."""

    def __init__(self, name: str, shards: TokenShards, seq_len: int, seed: int):
        self.name, self.shards, self.seq_len, self.seed = name, shards, seq_len, seed
        self.samples_per_epoch = (shards.n_tokens - 1) // seq_len
        if self.samples_per_epoch < 1:
            raise ValueError(
                f"source {name!r} ({shards.dir}) has {shards.n_tokens} tokens, fewer than "
                f"seq_len + 1 = {seq_len + 1}: not enough for one sample"
            )
        self._name_key = zlib.crc32(name.encode())  # the shuffle of one source ignores the others
        self._epochs = {}

    def _epoch(self, epoch: int):
        if epoch not in self._epochs:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, self._name_key, epoch]))
            order = rng.permutation(self.shards.n_docs)
            ends = np.cumsum(self.shards.doc_len[order])
            if len(self._epochs) >= 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = (order, np.concatenate([[0], ends]))
        return self._epochs[epoch]

    def read(self, k: int, out: np.ndarray) -> None:
        """Write the source's k-th sample (seq_len + 1 tokens) into `out`."""
        epoch, r = divmod(int(k), self.samples_per_epoch)
        order, starts = self._epoch(epoch)
        pos, start, want = 0, r * self.seq_len, self.seq_len + 1
        i = int(np.searchsorted(starts, start, side="right")) - 1
        s = self.shards
        while pos < want:
            doc = order[i]
            offset = start + pos - starts[i]
            n = min(int(s.doc_len[doc] - offset), want - pos)
            begin = s.doc_start[doc] + offset
            out[pos : pos + n] = s.arrays[s.doc_shard[doc]][begin : begin + n]
            pos += n
            i += 1


class BlendedTrainLoader:
    def __init__(
        self,
        cfg: DataConfig,
        streams: dict,
        tokenizer,
        *,
        seq_len: int,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        total_samples: int,
    ):
        self.cfg, self.tokenizer, self.streams = cfg, tokenizer, streams
        self.seq_len, self.global_batch_size, self.micro_batch_size = seq_len, global_batch_size, micro_batch_size
        self.rank, self.world_size, self.seed, self.total_samples = rank, world_size, seed, total_samples
        self.per_rank = global_batch_size // world_size
        self.grad_accum = self.per_rank // micro_batch_size
        self.source_names = list(streams)
        self.schedule = BlendSchedule(cfg.phases, self.source_names, total_samples, seed)
        self.step, self.microbatch = 0, 0
        self.counts = np.zeros((self.schedule.num_phases, len(self.source_names)), dtype=np.int64)
        self._plan = None

    # -- the stream --------------------------------------------------------------------------
    def _plan_step(self, step: int):
        """Source and per-source sample number k of every sample of global step `step`."""
        index = np.arange(step * self.global_batch_size, (step + 1) * self.global_batch_size, dtype=np.int64)
        sources = self.schedule.sources_of(index)
        k = np.empty_like(sources)
        drawn = self.counts.sum(axis=0)
        for s in np.unique(sources):
            mask = sources == s
            k[mask] = drawn[s] + np.arange(int(mask.sum()))
        step_counts = np.bincount(
            self.schedule.phase_of(index) * len(self.source_names) + sources, minlength=self.counts.size
        ).reshape(self.counts.shape)
        return step, sources, k, step_counts

    def next_microbatch(self):
        """(x, y) LongTensors [micro_batch_size, seq_len]; y is x shifted by one token."""
        if self._plan is None or self._plan[0] != self.step:
            self._plan = self._plan_step(self.step)
        _, sources, k, step_counts = self._plan
        first = self.rank * self.per_rank + self.microbatch * self.micro_batch_size
        batch = np.empty((self.micro_batch_size, self.seq_len + 1), dtype=np.int64)
        for row in range(self.micro_batch_size):
            stream = self.streams[self.source_names[sources[first + row]]]
            stream.read(k[first + row], batch[row])
        self.microbatch += 1
        if self.microbatch == self.grad_accum:  # this rank finished its share of the global step
            self._finish_step(step_counts)
        tokens = torch.from_numpy(batch)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def _finish_step(self, step_counts):
        before = self.counts.sum(axis=0)
        self.counts += step_counts
        after = self.counts.sum(axis=0)
        for s, name in enumerate(self.source_names):
            spe = self.streams[name].samples_per_epoch
            begun_before, begun_after = -(-int(before[s]) // spe), -(-int(after[s]) // spe)  # ceil
            if begun_after > max(begun_before, 1):
                log.info(
                    "data source %r ran out: epoch %d (fresh shuffle) begins in global step %d",
                    name,
                    begun_after - 1,
                    self.step,
                )
        self.step += 1
        self.microbatch = 0

    # -- state -------------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        return {
            # total_samples is not here: a run may be extended (see load_state_dict)
            "seed": self.seed,
            "seq_len": self.seq_len,
            "phases": [
                {"start": str(p.start), "weights": {s: str(w) for s, w in p.weights.items()}} for p in self.cfg.phases
            ],
            "sources": {name: st.shards.fingerprint() for name, st in self.streams.items()},
        }

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "fingerprint": self._fingerprint(),
            "consumed_samples": self.step * self.global_batch_size,
            "microbatch": self.microbatch,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "world_size": self.world_size,
            "source_samples": {name: int(n) for name, n in zip(self.source_names, self.counts.sum(axis=0))},
            "phase_starts": [int(s) for s in self.schedule.phase_starts],
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a data loader state (expected version {STATE_VERSION!r})")
        mine = self._fingerprint()
        differ = [key for key in mine if state["fingerprint"].get(key) != mine[key]]
        if differ:
            raise ValueError(
                f"data loader state comes from a different run: {', '.join(differ)} differ "
                f"(saved {[state['fingerprint'].get(k) for k in differ]}, "
                f"now {[mine[k] for k in differ]})"
            )
        consumed = int(state["consumed_samples"])
        if state["microbatch"] != 0 and (
            state["world_size"],
            state["micro_batch_size"],
            state["global_batch_size"],
        ) != (self.world_size, self.micro_batch_size, self.global_batch_size):
            raise ValueError(
                "data loader state was saved in the middle of a global step; it can only be continued "
                "with the same world_size, micro_batch_size and global_batch_size "
                f"(saved {state['world_size']}, {state['micro_batch_size']}, "
                f"{state['global_batch_size']})"
            )
        if consumed % self.global_batch_size:
            raise ValueError(
                f"data loader state has consumed {consumed} samples, not a multiple of "
                f"global_batch_size={self.global_batch_size}: cannot continue at a step boundary"
            )
        saved_starts = state.get("phase_starts")  # absent in states written before runs could be extended
        if saved_starts is not None:
            if (
                not isinstance(saved_starts, list)
                or len(saved_starts) != self.schedule.num_phases
                or not all(isinstance(s, int) for s in saved_starts)
            ):
                raise ValueError(
                    f"data loader state's phase_starts {saved_starts!r} are not "
                    f"{self.schedule.num_phases} sample indices"
                )
            starts = replan_starts(saved_starts, self.cfg.phases, self.total_samples, consumed)
            if starts != [int(s) for s in self.schedule.phase_starts]:  # the run was extended or shortened
                log.info(
                    "data blend phases start at global samples %s (phases already reached keep their start)", starts
                )
                self.schedule = BlendSchedule(
                    self.cfg.phases, self.source_names, self.total_samples, self.seed, phase_starts=starts
                )
        counts = self.schedule.counts_before(consumed)
        recomputed = {name: int(n) for name, n in zip(self.source_names, counts.sum(axis=0))}
        if recomputed != state["source_samples"]:
            # a state without phase_starts, from a run of another length: it continues exactly only if the
            # samples already consumed are the same ones (always true for a blend of one phase)
            raise ValueError(
                f"data loader state's per-source sample counts {state['source_samples']} do not match "
                f"this blend's {recomputed} at {consumed} samples (the state predates extensible "
                "runs and train.max_steps moves its blend phases: resume with the original max_steps)"
            )
        self.counts = counts
        self.step = consumed // self.global_batch_size
        self.microbatch = int(state["microbatch"])
        self._plan = None

    # -- accounting --------------------------------------------------------------------------
    def stats(self) -> dict:
        """Token accounting over all ranks for the completed global steps (targets: seq_len per sample)."""
        consumed = self.step * self.global_batch_size
        L = self.seq_len
        out = {
            "data/phase": int(self.schedule.phase_of(consumed)),
            "data/consumed_samples": consumed,
            "data/consumed_tokens": consumed * L,
        }
        per_source = self.counts.sum(axis=0)
        for s, name in enumerate(self.source_names):
            spe = self.streams[name].samples_per_epoch
            out[f"data/tokens/{name}"] = int(per_source[s]) * L
            out[f"data/epochs/{name}"] = float(per_source[s]) / spe
            out[f"data/reepochs/{name}"] = max(0, (int(per_source[s]) - 1) // spe)
        for p in range(self.schedule.num_phases):
            out[f"data/phase{p}/tokens"] = int(self.counts[p].sum()) * L
            for s, name in enumerate(self.source_names):
                out[f"data/phase{p}/tokens/{name}"] = int(self.counts[p, s]) * L
        return out


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def build_train_loader(
    data_cfg: DataConfig | dict,
    *,
    seq_len: int,
    global_batch_size: int,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    total_samples: int,
) -> BlendedTrainLoader:
    seq_len = _check_int("seq_len", seq_len, 1)
    global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
    micro_batch_size = _check_int("micro_batch_size", micro_batch_size, 1)
    world_size = _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0)
    seed = _check_int("seed", seed, 0)
    total_samples = _check_int("total_samples", total_samples, 1)
    if rank >= world_size:
        raise ValueError(f"rank={rank} must be < world_size={world_size}")
    if global_batch_size % (micro_batch_size * world_size):
        raise ValueError(
            f"global_batch_size={global_batch_size} must be divisible by micro_batch_size * "
            f"world_size = {micro_batch_size} * {world_size} (grad_accum = global / (micro * world))"
        )
    cfg = parse_data_config(data_cfg)
    tokenizer = load_tokenizer(cfg.tokenizer)
    used = [name for name in cfg.sources if any(name in p.weights for p in cfg.phases)]
    from .prepare import prepare_all  # here, not at import: see __init__.py

    dirs = prepare_all(cfg, splits=("train",), names=used)
    streams = {
        name: SourceStream(
            name,
            TokenShards(dirs[f"{name}/train"], expected_tokenizer=tokenizer, verify_checksums=cfg.verify_checksums),
            seq_len,
            seed,
        )
        for name in used
    }
    return BlendedTrainLoader(
        cfg,
        streams,
        tokenizer,
        seq_len=seq_len,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        rank=rank,
        world_size=world_size,
        seed=seed,
        total_samples=total_samples,
    )


def build_val_data(data_cfg: DataConfig | dict, *, seq_len: int, max_sequences_per_domain: int) -> dict:
    """Held-out documents of every source with a val split -> {source: LongTensor[n, seq_len + 1]}.
    Rows are consecutive windows over the documents in file order (EOS between them) with a stride of
    seq_len, so every held-out token is a target once; n = min(max_sequences_per_domain, available)."""
    seq_len = _check_int("seq_len", seq_len, 1)
    max_sequences_per_domain = _check_int("max_sequences_per_domain", max_sequences_per_domain, 1)
    cfg = parse_data_config(data_cfg)
    tokenizer = load_tokenizer(cfg.tokenizer)
    from .prepare import prepare_all

    dirs = prepare_all(cfg, splits=("val",))
    if not dirs:
        raise ValueError("no data.sources.<name>.val (or val_shards) configured: nothing to validate on")
    out = {}
    for key, split_dir in dirs.items():
        name = key.split("/")[0]
        shards = TokenShards(split_dir, expected_tokenizer=tokenizer, verify_checksums=cfg.verify_checksums)
        n = min(max_sequences_per_domain, (shards.n_tokens - 1) // seq_len)
        if n < 1:
            raise ValueError(
                f"validation split of source {name!r} ({split_dir}) has {shards.n_tokens} tokens, "
                f"fewer than seq_len + 1 = {seq_len + 1}"
            )
        need = n * seq_len + 1
        tokens = np.concatenate([np.asarray(a[:need]) for a in shards.arrays])[:need].astype(np.int64)
        rows = np.lib.stride_tricks.sliding_window_view(tokens, seq_len + 1)[::seq_len][:n]
        out[name] = torch.from_numpy(np.array(rows))  # a copy: a sliding-window view is read-only
    return out
