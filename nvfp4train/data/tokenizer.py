"""Tokenizers behind one small interface: encode / decode / vocab_size / eos_id / identity.

`identity` is a content hash of the tokenizer file: shards record it, and the loader refuses shards
made with another tokenizer.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .paths import resolve_path

EOS_TOKEN = "<|endoftext|>"
# GPT-2's pre-tokenization regex (as in tiktoken's gpt2 encoding).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ALIASES = {"bpe8k": "data/tokenizer/bpe8k.json"}


def _file_identity(kind: str, path: Path) -> str:
    return f"{kind}:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"


class HFTokenizer:
    """A `tokenizers` JSON file (e.g. the bundled byte-level BPE, data/tokenizer/bpe8k.json)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.path = path
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust library raises a bare Exception for garbage or truncated JSON
            raise ValueError(
                f"tokenizer file {path} is unreadable ({' '.join(str(e).split())[:200]}); "
                "data.tokenizer must name a `tokenizers` JSON file"
            ) from None
        eos = self._tok.token_to_id(EOS_TOKEN)
        if eos is None:
            raise ValueError(f"tokenizer {path} has no {EOS_TOKEN!r} token; the data pipeline needs it as EOS")
        self.eos_id = int(eos)
        self.vocab_size = int(self._tok.get_vocab_size())
        self.identity = _file_identity("tokenizers", path)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def save(self, path: Path) -> None:
        """The tokenizer as a `tokenizers` JSON file (what transformers' PreTrainedTokenizerFast loads)."""
        self._tok.save(str(path))


class TiktokenGPT2:
    """GPT-2's BPE via tiktoken from a local `gpt2.tiktoken` ranks file (tiktoken ships none offline;
    the openai-whisper sdist has one at whisper/assets/gpt2.tiktoken)."""

    def __init__(self, path: Path):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception as e:  # garbage or truncated: base64 or int parsing fails somewhere in the file
            raise ValueError(
                f"tokenizer file {path} is unreadable ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]}); it must be a .tiktoken ranks file"
            ) from None
        self._enc = tiktoken.Encoding(
            name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOS_TOKEN: len(ranks)}
        )
        self.path = path
        self.eos_id = len(ranks)
        self.vocab_size = len(ranks) + 1
        self.identity = _file_identity("tiktoken-gpt2", path)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(texts, num_threads=1)

    def decode(self, ids) -> str:
        return self._enc.decode(list(ids))


def load_tokenizer(name_or_path: str):
    """`bpe8k` (bundled), `gpt2` (needs a gpt2.tiktoken file: $NVFP4TRAIN_GPT2_TIKTOKEN or
    data/tokenizer/gpt2.tiktoken), a `tokenizers` .json path, or a .tiktoken path (GPT-2 pattern)."""
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path):
        raise ValueError(f"data.tokenizer must be a name (bpe8k, gpt2) or a path, got {name_or_path!r}")
    name = str(name_or_path)
    if name == "gpt2":
        path = (
            Path(os.environ.get("NVFP4TRAIN_GPT2_TIKTOKEN", ""))
            if os.environ.get("NVFP4TRAIN_GPT2_TIKTOKEN")
            else resolve_path("data/tokenizer/gpt2.tiktoken")
        )
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer 'gpt2' needs a gpt2.tiktoken ranks file at {path} "
                "(or set NVFP4TRAIN_GPT2_TIKTOKEN); see data/README.md"
            )
        return TiktokenGPT2(path)
    path = resolve_path(ALIASES.get(name, name))
    if path.exists() and not path.is_file():  # a directory, a FIFO, a device: there, but not a file to read
        raise FileNotFoundError(f"tokenizer {path} is not a regular file (data.tokenizer={name!r})")
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path} (data.tokenizer={name!r})")
    if path.suffix == ".tiktoken":
        return TiktokenGPT2(path)
    return HFTokenizer(path)
