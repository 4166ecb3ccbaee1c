"""Small synthetic corpora whose sources can be told apart from the tokens alone.

Source `lower` writes only lowercase words, `digits` only numbers, `upper` only uppercase words, so
decoding any packed window says which source it came from (EOS aside).
"""

import json
import os
import random

import pytest

from nvfp4train.data import load_tokenizer, prepare_split

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

EOS = "<|endoftext|>"
ALPHABETS = {"lower": "abcdefghijklmnopqrstuvwxyz", "digits": "0123456789", "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}


def write_docs(path, n_docs, alphabet, seed, words=(5, 60)):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n_docs):
            n = rng.randint(*words)
            text = " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(n))
            f.write(json.dumps({"text": text}) + "\n")
    return path


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("bpe8k")


@pytest.fixture
def corpus(tmp_path):
    """A data config over three distinguishable sources, with val splits, cached in tmp_path."""
    sources = {}
    for i, (name, alphabet) in enumerate(ALPHABETS.items()):
        n_docs = {"lower": 300, "digits": 150, "upper": 60}[name]
        train = write_docs(tmp_path / f"{name}.train.jsonl", n_docs, alphabet, seed=i)
        val = write_docs(tmp_path / f"{name}.val.jsonl", 20, alphabet, seed=100 + i)
        sources[name] = {"train": str(train), "val": str(val)}
    return {
        "tokenizer": "bpe8k",
        "cache_dir": str(tmp_path / "cache"),
        "sources": sources,
        "phases": [
            {"start": 0.0, "weights": {"lower": 0.5, "digits": 0.3, "upper": 0.2}},
            {"start": 0.7, "weights": {"lower": 0.2, "digits": 0.6, "upper": 0.2}},
            {"start": 0.9, "weights": {"digits": 0.25, "upper": 0.75}},
        ],
    }


@pytest.fixture
def prepared(corpus, tmp_path):
    """`lower` prepared explicitly, then used as a `shards:` source."""
    out = tmp_path / "prepared" / "lower"
    prepare_split(corpus["sources"]["lower"]["train"], out, tokenizer="bpe8k", progress=False)
    corpus["sources"]["lower"] = {"shards": str(out)}
    return corpus, out


def source_of_row(tokenizer, row) -> str:
    """Which synthetic source a packed row came from, from its characters."""
    chars = set(tokenizer.decode(list(row)).replace(EOS, "").replace(" ", ""))
    matches = [name for name, alphabet in ALPHABETS.items() if chars <= set(alphabet)]
    assert len(matches) == 1, f"row mixes sources or is empty: {sorted(chars)[:20]}"
    return matches[0]


@pytest.fixture
def source_of(tokenizer):
    return lambda row: source_of_row(tokenizer, row)
