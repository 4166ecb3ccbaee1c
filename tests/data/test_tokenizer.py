import json

import pytest

from nvfp4train.data import load_tokenizer
from nvfp4train.data.paths import REPO_ROOT


def test_bundled_bpe_is_byte_level_8k_with_eos(tokenizer):
    assert tokenizer.vocab_size == 8192
    assert tokenizer.decode([tokenizer.eos_id]) == "<|endoftext|>"
    # Byte-level: any text (code, accents, emoji, control characters) round-trips exactly.
    text = "def f(x):\n\treturn x ** 2  # café ✓ 🙂 \x00 ünïcödé\r\n"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    # It was trained on the corpus: common English and Python compress well below 1 token per char.
    prose = "The king said that he would not return to the castle before the end of the war."
    assert len(tokenizer.encode(prose)) < len(prose) / 3


def test_identity_is_a_content_hash(tmp_path, tokenizer):
    assert tokenizer.identity == load_tokenizer(str(REPO_ROOT / "data/tokenizer/bpe8k.json")).identity
    spec = json.loads((REPO_ROOT / "data/tokenizer/bpe8k.json").read_text())
    spec["model"]["vocab"]["zzz_extra"] = 8192
    other = tmp_path / "other.json"
    other.write_text(json.dumps(spec))
    assert load_tokenizer(str(other)).identity != tokenizer.identity


def test_missing_tokenizer_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_tokenizer(str(tmp_path / "nope.json"))


def test_gpt2_without_a_ranks_file_says_where_to_put_it(monkeypatch, tmp_path):
    monkeypatch.setenv("NVFP4TRAIN_GPT2_TIKTOKEN", str(tmp_path / "gpt2.tiktoken"))
    with pytest.raises(FileNotFoundError, match="gpt2.tiktoken"):
        load_tokenizer("gpt2")


def test_gpt2_reproduces_gpt2_where_the_ranks_file_exists():
    import os

    path = os.environ.get("NVFP4TRAIN_GPT2_TIKTOKEN") or str(REPO_ROOT / "data/tokenizer/gpt2.tiktoken")
    if not os.path.isfile(path):
        pytest.skip("no gpt2.tiktoken here (see data/README.md)")
    tok = load_tokenizer("gpt2")
    assert tok.encode("Hello world") == [15496, 995]
    assert (tok.eos_id, tok.vocab_size) == (50256, 50257)
    assert tok.decode(tok.encode("héllo\n\tworld")) == "héllo\n\tworld"
