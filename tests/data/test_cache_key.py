"""The shard cache is keyed by what the shards are made from, not by the source's name: two data configs
with a source of the same name (bundled and corpora both have `literature`) keep both caches, and
switching between them rebuilds nothing."""

from nvfp4train.data.prepare import prepare_all
from nvfp4train.data.shards import read_manifest
from tests.data.conftest import write_docs


def _config(tmp_path, train_file):
    return {
        "tokenizer": "bpe8k",
        "cache_dir": str(tmp_path / "cache"),
        "sources": {"literature": {"train": str(train_file)}},
    }


def test_same_source_name_other_files_coexist(tmp_path):
    small = write_docs(tmp_path / "small.jsonl", 20, "abc", seed=0)
    large = write_docs(tmp_path / "large.jsonl", 42, "xyz", seed=1)
    a = prepare_all(_config(tmp_path, small), splits=("train",))["literature/train"]
    b = prepare_all(_config(tmp_path, large), splits=("train",))["literature/train"]
    assert a != b and a.parent.name.startswith("literature-") and b.parent.name.startswith("literature-")
    assert (read_manifest(a)["n_docs"], read_manifest(b)["n_docs"]) == (20, 42)
    built = {d: (d / "manifest.json").stat().st_mtime_ns for d in (a, b)}
    for train_file, d in ((small, a), (large, b), (small, a)):  # switching back and forth rebuilds nothing
        assert prepare_all(_config(tmp_path, train_file), splits=("train",))["literature/train"] == d
    assert {d: (d / "manifest.json").stat().st_mtime_ns for d in (a, b)} == built
    write_docs(small, 25, "abc", seed=2)  # the same file with new contents: another key, built afresh
    c = prepare_all(_config(tmp_path, small), splits=("train",))["literature/train"]
    assert c not in (a, b) and read_manifest(c)["n_docs"] == 25
