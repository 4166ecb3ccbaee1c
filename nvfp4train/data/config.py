"""The data config (plain dict from configs/data/<name>.yaml), validated once into dataclasses.

    tokenizer: data/tokenizer/bpe8k.json
    sources:
      literature:
        train: data/bundled/literature.train.jsonl.gz     # file, glob, dir, or list of them
        val: data/bundled/literature.val.jsonl.gz          # optional held-out documents
        text_field: text                                   # for jsonl / parquet / hub sources
      books:
        shards: /path/to/prepared/books/train              # already prepared shards (manifest.json)
        val_shards: /path/to/prepared/books/val
      web:
        train: {hf: "some/dataset", name: null, split: train}   # a hub dataset, where a hub is reachable
      kjv:
        train: data/corpora/kjv/train.jsonl.gz
        val: data/corpora/kjv/val.jsonl.gz
        sha256: {train: 3f2a..., val: 9c01...}             # optional: the files must have these sha256
    phases:                            # start = fraction of all training tokens; weights = token fractions
      - {start: 0.0, weights: {literature: 0.5, web: 0.5}}
      - {start: 0.7, weights: {literature: 0.3, web: 0.7}}

Every key, its default and its meaning: the dataclasses below (DataConfig, SourceConfig, PhaseSpec).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from enum import StrEnum
from fractions import Fraction
from typing import Any

from nvfp4train.config.schema import ConfigError, bounded, check, not_a_key, parse, to_plain

SourceFormat = StrEnum("SourceFormat", "jsonl json txt parquet")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class InputHashes:
    """A source's `sha256`: the expected sha256 of the one file each split reads. Preparing the shards refuses
    a file with another sha256 (prepare.py), so that a run trains on exactly the corpus a config names (the
    reproduction's, configs/data/repro30m.yaml), not on one rebuilt with other package versions."""

    key: str = not_a_key()
    """The config key, data.sources.<name>.sha256 (not a config key)."""
    train: str | None = None
    """The sha256 (64 hex digits, as `sha256sum` prints it) of the training file; null: not checked."""
    val: str | None = None
    """The same for the held-out file."""

    def __post_init__(self):
        check(self, self.key)
        for split in ("train", "val"):
            value = getattr(self, split)
            if value is not None and not _SHA256.fullmatch(value.lower()):
                raise ConfigError(
                    f"{self.key}.{split}={value!r}: expected the file's sha256, 64 hex digits "
                    "(`sha256sum FILE` or `python scripts/build_corpora.py --check` prints it), or null"
                )
            if value is not None:
                object.__setattr__(self, split, value.lower())


@dataclass(frozen=True)
class SourceConfig:
    name: str = not_a_key()
    """The source's key under `sources` (not a config key)."""
    train: object = None
    """Raw training documents: a file, a glob, a directory, a list of them, or {hf: dataset, name, split}."""
    val: object = None
    """Held-out documents, in the same forms (optional)."""
    shards: str | None = None
    """A directory of prepared token shards (manifest.json), instead of `train`."""
    val_shards: str | None = None
    """Prepared held-out shards, instead of `val`."""
    text_field: str = "text"
    """The text column of jsonl / parquet / hub sources."""
    format: SourceFormat | None = None
    """null: inferred from the file extension."""
    sha256: InputHashes | None = None
    """{train: <sha256>, val: <sha256>}: the expected sha256 of the one file each split reads (of `shards`: the
    file its manifest says it was made from); a file with another is refused. null: not checked."""

    def __post_init__(self):
        key = f"data.sources.{self.name}"
        if isinstance(self.sha256, Mapping):  # its key names the source, which only this level knows
            object.__setattr__(self, "sha256", parse(InputHashes, self.sha256, f"{key}.sha256", key=f"{key}.sha256"))
        check(self, key)
        if (self.train is None) == (self.shards is None):
            raise ConfigError(f"{key} needs exactly one of 'train' (raw documents) or 'shards' (prepared shards)")
        if self.val is not None and self.val_shards is not None:
            raise ConfigError(f"{key}: give 'val' or 'val_shards', not both")
        if self.sha256 is not None:
            for split, raw, prepared in (("train", self.train, self.shards), ("val", self.val, self.val_shards)):
                if getattr(self.sha256, split) is None:
                    continue
                if raw is None and prepared is None:
                    raise ConfigError(f"{key}.sha256.{split}: the source has no '{split}' to check; remove the key")
                if isinstance(raw, Mapping):
                    raise ConfigError(
                        f"{key}.sha256.{split}: checks a file, and {key}.{split} is a `datasets` input; remove the key"
                    )


@dataclass(frozen=True)
class Phase:
    start: Fraction  # fraction of total training tokens where this phase begins
    weights: dict  # source name -> normalized token fraction (sums to 1)


@dataclass(frozen=True)
class PhaseSpec:
    """One entry of `phases` as written (Phase is its exact, normalized form)."""

    index: int = not_a_key()
    """The phase's position in `phases` (not a config key)."""
    weights: dict[str, float]
    """Source name -> weight; weights are token fractions of the phase, normalized to sum to 1."""
    start: float | None = None
    """Fraction of all training tokens where the phase begins (0 for the first phase)."""
    name: str | None = None
    """A label, for reading the config."""

    def __post_init__(self):
        check(self, f"data.phases[{self.index}]")


@dataclass(frozen=True)
class DataConfig:
    tokenizer: str
    """A tokenizer name such as bpe8k, or the path of a tokenizer file."""
    sources: dict[str, object]
    """Source name -> SourceConfig (insertion order kept)."""
    written: dict[str, Any] = not_a_key()
    """The section as it was given, as plain data (not a config key): what config.yaml and a checkpoint record
    (`to_dict`). The parsed fields cannot give it back: the phase weights become exact normalized fractions
    and a source's unset keys take their defaults."""
    phases: tuple[object, ...] | None = None
    """Phases of the blend (Phase); null: one phase with equal token fractions."""
    cache_dir: str = "data/cache"
    """Token shards built from raw sources land here (gitignored); a relative path from an installed wheel
    goes under $XDG_CACHE_HOME/nvfp4train (nvfp4train.data.paths)."""
    num_proc: int = bounded(1, ge=1)
    """Tokenizing threads when building shards (the tokenizers release the GIL; the shards do not depend on it)."""
    verify_checksums: bool = False
    """sha256 every shard at start-up (sizes are always checked)."""
    docs_per_shard: int = bounded(100_000, ge=1)
    """Documents per token shard when building shards."""
    name: str | None = None
    """A label, for reading the config."""

    def __post_init__(self):
        check(self, "data")

    def to_dict(self) -> dict[str, Any]:
        """The section as it was given (`written`): the record a run's config.yaml and checkpoints keep."""
        return copy.deepcopy(self.written)


def _fraction(value: float, key: str) -> Fraction:
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be finite, got {value!r}")
    return Fraction(str(value))  # str() keeps decimal literals exact: 0.7 means 7/10, not the nearest binary float


def parse_data_config(cfg: dict | DataConfig) -> DataConfig:
    """The data section (plain data) checked and parsed: sources as SourceConfig, phases as exact Phase. A
    DataConfig (a RunConfig's `data`) is parsed already and comes back as it is."""
    if isinstance(cfg, DataConfig):
        return cfg
    raw = parse(DataConfig, cfg, "data", written=to_plain(cfg))
    if not isinstance(raw.sources, dict) or not raw.sources:
        raise ConfigError("data.sources must be a non-empty mapping of source name -> {train: ..., val: ...}")
    sources = {name: parse(SourceConfig, spec, f"data.sources.{name}", name=name) for name, spec in raw.sources.items()}

    raw_phases = raw.phases
    if raw_phases is None:  # one phase, equal token fractions
        raw_phases = [{"start": 0.0, "weights": {name: 1.0 for name in sources}}]
    if not raw_phases:
        raise ConfigError("data.phases must be a non-empty list of {start, weights}")
    phases = []
    for i, phase in enumerate(raw_phases):
        key = f"data.phases[{i}]"
        spec = parse(PhaseSpec, phase, key, index=i)
        if spec.start is None and i > 0:
            raise ConfigError(f"{key}.start: missing (the fraction of the training tokens where the phase begins)")
        start = _fraction(spec.start or 0.0, f"{key}.start")
        if i == 0 and start != 0:
            raise ConfigError(f"data.phases[0].start must be 0 (phases cover the whole run), got {spec.start}")
        if i > 0 and start <= phases[-1].start:
            raise ConfigError(
                f"{key}.start={spec.start} must be greater than data.phases[{i - 1}].start"
                f"={float(phases[-1].start)} (phase starts must increase)"
            )
        if start >= 1:
            raise ConfigError(f"{key}.start={spec.start} must be < 1 (a fraction of the training tokens)")
        if not spec.weights:
            raise ConfigError(f"{key}.weights must be a non-empty mapping of source name -> weight")
        parsed = {}
        for src, w in spec.weights.items():
            if src not in sources:
                raise ConfigError(f"{key}.weights.{src}: unknown source; data.sources has {list(sources)}")
            if w <= 0:
                raise ConfigError(
                    f"{key}.weights.{src}={phase['weights'][src]} must be > 0 (leave a source out "
                    "of a phase instead of giving it weight 0)"
                )
            parsed[src] = _fraction(w, f"{key}.weights.{src}")
        total = sum(parsed.values())
        phases.append(Phase(start=start, weights={s: w / total for s, w in parsed.items()}))
    return dataclass_replace(raw, sources=sources, phases=tuple(phases))
