"""Every bad input gets one clear error naming the key or file, before any training step."""

import copy
import json
import os

import numpy as np
import pytest

from nvfp4train.data import TokenShards, build_train_loader

ARGS = dict(seq_len=32, global_batch_size=8, micro_batch_size=2, rank=0, world_size=1, seed=0, total_samples=100)


def build(cfg, **kw):
    return build_train_loader(cfg, **{**ARGS, **kw})


def with_phases(corpus, phases):
    cfg = copy.deepcopy(corpus)
    cfg["phases"] = phases
    return cfg


def test_missing_path_names_the_file(corpus, tmp_path):
    corpus["sources"]["lower"]["train"] = str(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        build(corpus)


@pytest.mark.parametrize(
    "source, name, records, match",
    [
        ("digits", "empty.jsonl", [{"text": ""}], r"data.sources.digits.train.*empty source"),
        ("digits", "tiny.jsonl", [{"text": "abc def"}], r"'digits'.*fewer than seq_len"),
        ("lower", "bad.jsonl", [{"text": "ok"}, {"body": "x"}], r"bad.jsonl:2: no 'text' field"),
    ],
    ids=["empty", "smaller-than-one-sample", "no-text-field"],
)
def test_bad_source_file_names_the_source(corpus, tmp_path, source, name, records, match):
    path = tmp_path / name
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    corpus["sources"][source]["train"] = str(path)
    with pytest.raises(ValueError, match=match):
        build(corpus)


@pytest.mark.parametrize("weight", [0, -0.5, "heavy"])
def test_bad_weights_name_the_key(corpus, weight):
    cfg = with_phases(corpus, [{"start": 0, "weights": {"lower": 1, "digits": weight}}])
    with pytest.raises(ValueError, match=r"data.phases\[0\].weights.digits"):
        build(cfg)


def test_unknown_source_in_weights(corpus):
    cfg = with_phases(corpus, [{"start": 0, "weights": {"lower": 1, "books": 1}}])
    with pytest.raises(ValueError, match=r"weights.books: unknown source"):
        build(cfg)


@pytest.mark.parametrize(
    "starts, match",
    [
        ((0.1, 0.7), r"phases\[0\].start must be 0"),
        ((0.0, 0.7, 0.7), r"phases\[2\].start=0.7 must be greater"),
        ((0.0, 0.9, 0.7), r"phases\[2\].start=0.7 must be greater"),
        ((0.0, 1.0), r"phases\[1\].start=1.0 must be < 1"),
    ],
)
def test_phase_starts_must_begin_at_zero_and_increase(corpus, starts, match):
    cfg = with_phases(corpus, [{"start": s, "weights": {"lower": 1}} for s in starts])
    with pytest.raises(ValueError, match=match):
        build(cfg)


def test_batch_layout_must_divide(corpus):
    with pytest.raises(ValueError, match="global_batch_size=8 must be divisible by micro_batch_size"):
        build(corpus, micro_batch_size=3)
    with pytest.raises(ValueError, match="rank=2 must be < world_size=2"):
        build(corpus, rank=2, world_size=2)


def test_unknown_config_key(corpus):
    corpus["shuffle_buffer"] = 100
    with pytest.raises(ValueError, match="unknown key.*shuffle_buffer"):
        build(corpus)


def test_truncated_shard_names_the_file(prepared):
    corpus, out = prepared
    shard = out / "shard_00000.bin"
    shard.write_bytes(shard.read_bytes()[:-6])
    with pytest.raises(ValueError, match=r"truncated or corrupt shard .*shard_00000.bin"):
        build(corpus)


def test_corrupt_shard_is_caught_by_checksums(prepared):
    corpus, out = prepared
    shard = out / "shard_00000.bin"
    tokens = np.fromfile(shard, dtype="<u2")
    tokens[10] ^= 1
    tokens.tofile(shard)
    build(corpus)  # sizes fine: only a checksum sees it
    corpus["verify_checksums"] = True
    with pytest.raises(ValueError, match="checksum mismatch.*shard_00000.bin"):
        build(corpus)


def test_missing_manifest_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        TokenShards(tmp_path)


# ------------------------------------------------------------------- damaged files, unusable cache_dir
def _gz(path, text: str) -> bytes:
    import gzip

    data = gzip.compress(text.encode())
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not_utf8"])
def test_damaged_gz_input_names_the_file(corpus, tmp_path, damage):
    good = "".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(200))
    bad = tmp_path / "lower.train.jsonl.gz"
    data = _gz(bad, good)
    if damage == "garbage":  # a download that saved an error page under the name
        bad.write_bytes(b"<html>502 Bad Gateway</html>" * 10)
    elif damage == "truncated":  # a copy killed part-way
        bad.write_bytes(data[: len(data) // 2])
    else:
        import gzip

        bad.write_bytes(gzip.compress(b'{"text": "\xff\xfe latin-1 bytes"}\n'))
    corpus["sources"]["lower"]["train"] = str(bad)
    with pytest.raises(ValueError, match=r"lower.train.jsonl.gz: unreadable \(.*\); data.sources.lower.train must"):
        build(corpus)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_tokenizer_file_names_the_file(corpus, tmp_path, damage):
    from nvfp4train.data.paths import resolve_path

    text = resolve_path("data/tokenizer/bpe8k.json").read_bytes()
    bad = tmp_path / "tok.json"
    bad.write_bytes(text[: len(text) // 3] if damage == "truncated" else b"\x00\x9f garbage")
    corpus["tokenizer"] = str(bad)
    with pytest.raises(ValueError, match=r"tokenizer file .*tok.json is unreadable"):
        build(corpus)


@pytest.mark.parametrize(
    "unusable, reason",
    [
        ("a_file", "File exists|Not a directory"),
        pytest.param(
            "read_only",
            "Permission denied",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory"),
        ),
    ],
)
def test_unusable_cache_dir_is_named(corpus, tmp_path, unusable, reason):
    cache = tmp_path / "cache"  # the corpus fixture's cache_dir
    if unusable == "a_file":
        cache.write_text("not a directory")
    else:
        cache.mkdir()
        cache.chmod(0o555)
    try:
        with pytest.raises(
            ValueError,
            match=r"data.cache_dir=.*cache': cannot write the token shards of "
            rf"data.sources.lower.train there.*({reason})",
        ):
            build(corpus)
    finally:
        if cache.is_dir():
            cache.chmod(0o755)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.pop("dtype"), "manifest.json: field dtype missing"),
        (lambda m: m.pop("vocab_size"), "manifest.json: field vocab_size missing"),
        (lambda m: m["shards"][0].pop("n_tokens"), r"manifest.json: field shards\[0\].n_tokens missing"),
        (
            lambda m: m["shards"][0].update(n_docs="many"),
            r"manifest.json: field shards\[0\].n_docs is 'many', expected an integer",
        ),
        (lambda m: m.update(shards={}), "manifest.json: field shards is {}, expected a list"),
        # shards from another tokenizer are refused
        (
            lambda m: m.update(tokenizer="tokenizers:0123456789abcdef"),
            "made with tokenizer tokenizers:0123456789abcdef",
        ),
    ],
)
def test_bad_manifest_names_the_field(prepared, edit, match):
    corpus, out = prepared
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=match):
        build(corpus)


def test_shard_corrupted_at_the_same_size_is_caught_by_the_vocab_check(prepared):
    """A flipped high bit leaves the size intact; the id past the vocab would index past the embedding."""
    corpus, out = prepared
    shard = out / "shard_00000.bin"
    tokens = np.fromfile(shard, dtype="<u2")
    tokens[10] |= 0x8000  # 8192-token vocab: any id >= 32768 is out of range
    tokens.tofile(shard)
    with pytest.raises(
        ValueError,
        match=r"corrupt shard .*shard_00000.bin: token id \d+ >= the tokenizer's "
        r"vocab size 8192",
    ):
        build(corpus)
