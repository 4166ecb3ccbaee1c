"""Which source (and which phase) every global sample index belongs to: a pure function of the index.

Phases start at token fractions of the run (total_samples * seq_len tokens). Every sample carries
seq_len target tokens, so a token fraction is a sample fraction: phase p owns the global samples
[ceil(start_p * total_samples), ceil(start_{p+1} * total_samples)) and the last phase runs on past
total_samples.

Within a phase, sample j is given to the source whose slice of [0, 1) (widths = token weights) holds
x_j = frac(u_p + j / golden_ratio), computed exactly in 64-bit integer arithmetic. This Weyl sequence
has low discrepancy: after n samples every source's count is within a few samples of weight * n (far
tighter than independent random draws, whose error grows like sqrt(n)), while consecutive samples
still alternate between sources irregularly. No state is needed to know the source of sample i.

A run extended on resume (a larger train.max_steps, so a larger total_samples) must not change the
source of any sample already drawn, so `replan_starts` decides where the phases start from then on:
a phase the run has already reached keeps the start it had (its samples are history); a phase still
ahead starts at its fraction of the new total, but not before the resumed position. Extending a run
inside phase 0 therefore stretches the whole plan; extending a finished run continues in its last phase.
The phase starts travel in the loader's state, so every later resume applies the same rule.
"""

from __future__ import annotations

import math

import numpy as np

_TWO64 = 1 << 64
_GOLDEN_STEP = np.uint64(0x9E3779B97F4A7C15)  # round(2**64 / golden ratio), odd
_CHUNK = 1 << 20


class BlendSchedule:
    def __init__(self, phases, source_names: list[str], total_samples: int, seed: int, phase_starts=None):
        """phase_starts: the first global sample of each phase (default: each phase's start fraction of
        total_samples; a resumed run passes `replan_starts`'s)."""
        self.source_names = list(source_names)
        self.total_samples = int(total_samples)
        col = {name: i for i, name in enumerate(self.source_names)}
        if phase_starts is None:
            phase_starts = planned_starts(phases, self.total_samples)
        self.phase_starts = np.array(phase_starts, dtype=np.int64)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xB1E4D]))
        self.offsets = [np.uint64(rng.integers(0, _TWO64, dtype=np.uint64)) for _ in phases]
        self.thresholds, self.columns = [], []
        for phase in phases:
            names = list(phase.weights)
            cumulative, bounds = 0, []
            for name in names[:-1]:
                cumulative += phase.weights[name]
                bounds.append(math.floor(cumulative * _TWO64))
            self.thresholds.append(np.array(bounds, dtype=np.uint64))
            self.columns.append(np.array([col[n] for n in names], dtype=np.int64))

    @property
    def num_phases(self) -> int:
        return len(self.phase_starts)

    def phase_of(self, index) -> np.ndarray:
        return np.searchsorted(self.phase_starts, np.asarray(index, dtype=np.int64), side="right") - 1

    def sources_of(self, index) -> np.ndarray:
        """Global sample indices -> source column (index into source_names)."""
        index = np.asarray(index, dtype=np.int64)
        phase = self.phase_of(index)
        out = np.empty(index.shape, dtype=np.int64)
        for p in np.unique(phase):
            mask = phase == p
            local = (index[mask] - self.phase_starts[p]).astype(np.uint64)
            x = local * _GOLDEN_STEP + self.offsets[p]  # wraps mod 2**64 by design
            out[mask] = self.columns[p][np.searchsorted(self.thresholds[p], x, side="right")]
        return out

    def counts_before(self, n_samples: int) -> np.ndarray:
        """[num_phases, num_sources] samples drawn per phase and source among global samples [0, n)."""
        counts = np.zeros((self.num_phases, len(self.source_names)), dtype=np.int64)
        for start in range(0, int(n_samples), _CHUNK):
            index = np.arange(start, min(start + _CHUNK, int(n_samples)), dtype=np.int64)
            flat = self.phase_of(index) * counts.shape[1] + self.sources_of(index)
            counts += np.bincount(flat, minlength=counts.size).reshape(counts.shape)
        return counts


def planned_starts(phases, total_samples: int) -> list[int]:
    """Each phase's first global sample: its start fraction of the run's samples."""
    # Fraction arithmetic keeps the boundaries exact (0.7 * 1000 samples is sample 700, not 699).
    return [math.ceil(p.start * int(total_samples)) for p in phases]


def replan_starts(saved_starts: list[int], phases, total_samples: int, consumed: int) -> list[int]:
    """The phase starts of a run resumed after `consumed` samples with a new `total_samples`: a phase
    already reached (saved start <= consumed) keeps its start, a later one moves to its fraction of the
    new total, not before `consumed`. The sources of samples [0, consumed) do not change."""
    return [
        saved if saved <= consumed else max(int(consumed), new)
        for saved, new in zip(saved_starts, planned_starts(phases, total_samples))
    ]
