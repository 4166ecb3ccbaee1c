"""Data: tokenizer, raw documents -> token shards, phased blends, deterministic resumable loader.

tok = load_tokenizer("bpe8k")
loader = build_train_loader(data_cfg, seq_len=..., global_batch_size=..., micro_batch_size=...,
                            rank=..., world_size=..., seed=..., total_samples=...)
x, y = loader.next_microbatch()
val = build_val_data(data_cfg, seq_len=..., max_sequences_per_domain=...)
"""

from .config import DataConfig, Phase, SourceConfig, parse_data_config
from .loader import BlendedTrainLoader, build_train_loader, build_val_data
from .shards import TokenShards
from .tokenizer import load_tokenizer


def __getattr__(name: str):
    # prepare is imported when first used, so `python -m nvfp4train.data.prepare` runs a module that
    # was not imported already (runpy warns about that on every run otherwise)
    if name in ("prepare_all", "prepare_split"):
        from . import prepare

        return getattr(prepare, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "load_tokenizer",
    "build_train_loader",
    "build_val_data",
    "BlendedTrainLoader",
    "prepare_all",
    "prepare_split",
    "TokenShards",
    "parse_data_config",
    "DataConfig",
    "Phase",
    "SourceConfig",
]
