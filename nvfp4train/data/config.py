"""The data config (plain dict from configs/data/<name>.yaml), validated once into dataclasses.

    tokenizer: data/tokenizer/bpe8k.json
    cache_dir: data/cache              # token shards built from raw sources land here (gitignored)
    num_proc: 1                        # tokenizer processes when building shards
    verify_checksums: false            # sha256 every shard at start-up (sizes are always checked)
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
    phases:                            # start = fraction of all training tokens; weights = token fractions
      - {start: 0.0, weights: {literature: 0.5, web: 0.5}}
      - {start: 0.7, weights: {literature: 0.3, web: 0.7}}
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

KNOWN_KEYS = {"tokenizer", "cache_dir", "num_proc", "verify_checksums", "sources", "phases", "name", "docs_per_shard"}
SOURCE_KEYS = {"train", "val", "shards", "val_shards", "text_field", "format"}


@dataclass(frozen=True)
class SourceConfig:
    name: str
    train: object = None          # raw input spec (path / glob / list / {hf: ...}) or None
    val: object = None
    shards: str | None = None     # prepared shard dir, instead of `train`
    val_shards: str | None = None
    text_field: str = "text"
    format: str | None = None     # jsonl | json | txt | parquet; inferred from the extension if None


@dataclass(frozen=True)
class Phase:
    start: Fraction               # fraction of total training tokens where this phase begins
    weights: dict                 # source name -> normalized token fraction (sums to 1)


@dataclass(frozen=True)
class DataConfig:
    tokenizer: str
    sources: dict                 # name -> SourceConfig (insertion order kept)
    phases: tuple
    cache_dir: str = "data/cache"
    num_proc: int = 1
    verify_checksums: bool = False
    docs_per_shard: int = 100_000
    extra: dict = field(default_factory=dict)


def _fraction(value, key: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    try:
        # str() keeps decimal literals exact: 0.7 means 7/10, not the nearest binary float.
        frac = Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(float(frac)):
        raise ValueError(f"{key} must be finite, got {value!r}")
    return frac


def parse_data_config(cfg: dict) -> DataConfig:
    if not isinstance(cfg, dict):
        raise ValueError(f"data config must be a mapping, got {type(cfg).__name__}")
    unknown = set(cfg) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"data config: unknown key(s) {sorted(unknown)}; allowed: {sorted(KNOWN_KEYS)}")
    if "tokenizer" not in cfg:
        raise ValueError("data.tokenizer is missing (a tokenizer name such as bpe8k, or a path)")

    raw_sources = cfg.get("sources")
    if not isinstance(raw_sources, dict) or not raw_sources:
        raise ValueError("data.sources must be a non-empty mapping of source name -> {train: ..., val: ...}")
    sources = {}
    for name, spec in raw_sources.items():
        key = f"data.sources.{name}"
        if not isinstance(spec, dict):
            raise ValueError(f"{key} must be a mapping with 'train' (or 'shards') and optional 'val'")
        unknown = set(spec) - SOURCE_KEYS
        if unknown:
            raise ValueError(f"{key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(SOURCE_KEYS)}")
        if (spec.get("train") is None) == (spec.get("shards") is None):
            raise ValueError(f"{key} needs exactly one of 'train' (raw documents) or 'shards' (prepared shards)")
        if spec.get("val") is not None and spec.get("val_shards") is not None:
            raise ValueError(f"{key}: give 'val' or 'val_shards', not both")
        fmt = spec.get("format")
        if fmt is not None and fmt not in ("jsonl", "json", "txt", "parquet"):
            raise ValueError(f"{key}.format must be one of jsonl, json, txt, parquet; got {fmt!r}")
        sources[str(name)] = SourceConfig(name=str(name), train=spec.get("train"), val=spec.get("val"),
                                          shards=spec.get("shards"), val_shards=spec.get("val_shards"),
                                          text_field=str(spec.get("text_field", "text")), format=fmt)

    raw_phases = cfg.get("phases")
    if raw_phases is None:   # one phase, equal token fractions
        raw_phases = [{"start": 0.0, "weights": {name: 1.0 for name in sources}}]
    if not isinstance(raw_phases, (list, tuple)) or not raw_phases:
        raise ValueError("data.phases must be a non-empty list of {start, weights}")
    phases = []
    for i, phase in enumerate(raw_phases):
        key = f"data.phases[{i}]"
        if not isinstance(phase, dict) or set(phase) - {"start", "weights", "name"} or "weights" not in phase:
            raise ValueError(f"{key} must be a mapping with 'start' and 'weights', got {phase!r}")
        start = _fraction(phase.get("start", 0.0 if i == 0 else None), f"{key}.start")
        if i == 0 and start != 0:
            raise ValueError(f"data.phases[0].start must be 0 (phases cover the whole run), got {phase['start']}")
        if i > 0 and start <= phases[-1].start:
            raise ValueError(f"{key}.start={phase['start']} must be greater than data.phases[{i - 1}].start"
                             f"={float(phases[-1].start)} (phase starts must increase)")
        if start >= 1:
            raise ValueError(f"{key}.start={phase['start']} must be < 1 (a fraction of the training tokens)")
        weights = phase["weights"]
        if not isinstance(weights, dict) or not weights:
            raise ValueError(f"{key}.weights must be a non-empty mapping of source name -> weight")
        parsed = {}
        for src, w in weights.items():
            if src not in sources:
                raise ValueError(f"{key}.weights.{src}: unknown source; data.sources has {list(sources)}")
            w = _fraction(w, f"{key}.weights.{src}")
            if w <= 0:
                raise ValueError(f"{key}.weights.{src}={weights[src]} must be > 0 (leave a source out of a "
                                 "phase instead of giving it weight 0)")
            parsed[src] = w
        total = sum(parsed.values())
        phases.append(Phase(start=start, weights={s: w / total for s, w in parsed.items()}))

    num_proc = cfg.get("num_proc", 1)
    if not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1:
        raise ValueError(f"data.num_proc must be an integer >= 1, got {num_proc!r}")
    docs_per_shard = cfg.get("docs_per_shard", 100_000)
    if not isinstance(docs_per_shard, int) or docs_per_shard < 1:
        raise ValueError(f"data.docs_per_shard must be an integer >= 1, got {docs_per_shard!r}")
    return DataConfig(tokenizer=str(cfg["tokenizer"]), sources=sources, phases=tuple(phases),
                      cache_dir=str(cfg.get("cache_dir", "data/cache")), num_proc=num_proc,
                      verify_checksums=bool(cfg.get("verify_checksums", False)), docs_per_shard=docs_per_shard)
