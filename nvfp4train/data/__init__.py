"""Data: tokenizer, raw documents -> token shards, phased blends, deterministic resumable loader.

tok = load_tokenizer("bpe8k")
loader = build_train_loader(data_cfg, seq_len=..., global_batch_size=..., micro_batch_size=...,
                            rank=..., world_size=..., seed=..., total_samples=...)
x, y = loader.next_microbatch()
val = build_val_data(data_cfg, seq_len=..., max_sequences_per_domain=...)
"""

from typing import TYPE_CHECKING

from nvfp4train.lazy import lazy_names

from .config import DataConfig, Phase, SourceConfig, parse_data_config

if TYPE_CHECKING:
    from .loader import BlendedTrainLoader, build_train_loader, build_val_data
    from .prepare import prepare_all, prepare_split
    from .shards import TokenShards
    from .tokenizer import load_tokenizer

# Imported when first used: the config (which every command's options hold) without torch and numpy, and
# prepare so that `python -m nvfp4train.data.prepare` runs a module that was not imported already (runpy
# warns about that on every run otherwise).
_LAZY = {
    "BlendedTrainLoader": "loader",
    "build_train_loader": "loader",
    "build_val_data": "loader",
    "TokenShards": "shards",
    "load_tokenizer": "tokenizer",
    "prepare_all": "prepare",
    "prepare_split": "prepare",
}


__getattr__ = lazy_names(__name__, _LAZY)


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
