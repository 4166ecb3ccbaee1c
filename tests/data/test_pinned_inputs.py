"""A source's `sha256` pins the file each split is made from: a file with another sha256 is refused in one
line naming it, the expected and the found hash and what to do, before anything is written (raw inputs) or
used (prepared shards); the pinned file is accepted; no key, no check. `corpus_record` names what a run
reads; `scripts/build_corpora.py --check` compares built files with a config's pins."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import yaml

from nvfp4train.config.schema import ConfigError
from nvfp4train.data.config import parse_data_config
from nvfp4train.data.prepare import corpus_record, prepare_all, prepare_split
from nvfp4train.data.shards import sha256_file
from tests.conftest import REPO
from tests.data.conftest import write_docs


def _config(tmp_path, train, val=None, sha256=None, **source):
    spec = {"train": train if isinstance(train, list) else str(train), **({"val": str(val)} if val else {}), **source}
    if sha256 is not None:
        spec["sha256"] = sha256
    return {"tokenizer": "bpe8k", "cache_dir": str(tmp_path / "cache"), "sources": {"kjv": spec}}


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_a_file_with_another_sha256_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    train = write_docs(tmp_path / "train.jsonl", 20, "abc", seed=0)
    wrong = "0" * 64
    with pytest.raises(ValueError) as err:
        prepare_all(_config(tmp_path, train, sha256={"train": wrong}), splits=("train",))
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"{train}: sha256 {sha256_file(train)[:16]}..., but data.sources.kjv.sha256.train ")
    assert f"expects {wrong[:16]}...: not the pinned corpus" in line
    assert "python scripts/build_corpora.py --corpora" in line and "data/README.md" in line
    assert "or set data.sources.kjv.sha256.train=null to train on this file" in line
    assert _tree(tmp_path / "cache") == []  # refused before the cache directory was made

    # a cache built from the file before it was pinned is left as it is
    built = prepare_all(_config(tmp_path, train), splits=("train",))["kjv/train"]
    before = {p: p.stat().st_mtime_ns for p in built.iterdir()}
    with pytest.raises(ValueError, match="not the pinned corpus"):
        prepare_all(_config(tmp_path, train, sha256={"train": wrong}), splits=("train",))
    assert {p: p.stat().st_mtime_ns for p in built.iterdir()} == before


def test_the_pinned_file_is_accepted_and_no_key_checks_nothing(tmp_path):
    train = write_docs(tmp_path / "train.jsonl", 20, "abc", seed=0)
    val = write_docs(tmp_path / "val.jsonl", 5, "abc", seed=1)
    pins = {"train": sha256_file(train).upper(), "val": sha256_file(val)}  # sha256sum's case or not
    pinned = prepare_all(_config(tmp_path, train, val, sha256=pins))
    assert sorted(pinned) == ["kjv/train", "kjv/val"]
    assert prepare_all(_config(tmp_path, train, val)) == pinned  # the same shards, no check
    assert prepare_all(_config(tmp_path, train, val, sha256={"train": pins["train"], "val": None})) == pinned
    write_docs(val, 6, "abc", seed=2)  # the held-out file changes: its pin refuses it, the training split is fine
    assert "kjv/train" in prepare_all(_config(tmp_path, train, val, sha256=pins), splits=("train",))
    with pytest.raises(ValueError, match=rf"^{val}: sha256 .* data.sources.kjv.sha256.val expects"):
        prepare_all(_config(tmp_path, train, val, sha256=pins), splits=("val",))


def test_the_training_entry_points_refuse_it_too(tmp_path):
    from nvfp4train.data import build_train_loader, build_val_data

    train = write_docs(tmp_path / "train.jsonl", 20, "abc", seed=0)
    cfg = _config(tmp_path, train, train, sha256={"train": sha256_file(train), "val": "1" * 64})
    loader = build_train_loader(
        cfg, seq_len=16, global_batch_size=2, micro_batch_size=2, rank=0, world_size=1, seed=0, total_samples=4
    )
    assert loader.source_names == ["kjv"]
    with pytest.raises(ValueError, match=r"data.sources.kjv.sha256.val expects 1111111111111111\.\.\."):
        build_val_data(cfg, seq_len=16, max_sequences_per_domain=1)


def test_prepared_shards_are_checked_against_what_their_manifest_was_made_from(tmp_path):
    train = write_docs(tmp_path / "train.jsonl", 20, "abc", seed=0)
    shards = tmp_path / "shards"
    prepare_split(str(train), shards, tokenizer="bpe8k")
    cfg = {"tokenizer": "bpe8k", "cache_dir": str(tmp_path / "cache"), "sources": {"kjv": {"shards": str(shards)}}}
    cfg["sources"]["kjv"]["sha256"] = {"train": sha256_file(train)}
    assert prepare_all(cfg, splits=("train",)) == {"kjv/train": shards}
    cfg["sources"]["kjv"]["sha256"] = {"train": "2" * 64}
    with pytest.raises(ValueError) as err:
        prepare_all(cfg, splits=("train",))
    assert str(err.value).startswith(
        f"{shards / 'manifest.json'}: made from train.jsonl with sha256 {sha256_file(train)[:16]}..., "
        "but data.sources.kjv.sha256.train expects 2222222222222222...: not the pinned corpus; "
    )


def test_a_pin_of_several_files_is_refused(tmp_path):
    for i in range(2):
        write_docs(tmp_path / f"part{i}.jsonl", 5, "abc", seed=i)
    with pytest.raises(ValueError, match=r"^data.sources.kjv.sha256.train: pins one file, but data.sources.kjv.train"):
        prepare_all(_config(tmp_path, tmp_path / "part*.jsonl", sha256={"train": "a" * 64}), splits=("train",))


@pytest.mark.parametrize(
    "sha256, message",
    [
        ({"train": "abc"}, "data.sources.kjv.sha256.train='abc': expected the file's sha256, 64 hex digits"),
        ({"tarin": "a" * 64}, "data.sources.kjv.sha256: unknown key 'tarin' (data.sources.kjv.sha256.tarin); "),
        ({"train": 7}, "data.sources.kjv.sha256.train: expected str, got 7 (int)"),
        ("abc", "data.sources.kjv.sha256: must be a mapping of keys to values"),
        ({"val": "a" * 64}, "data.sources.kjv.sha256.val: the source has no 'val' to check; remove the key"),
    ],
)
def test_bad_pins_are_one_line(tmp_path, sha256, message):
    with pytest.raises(ConfigError) as err:
        parse_data_config(_config(tmp_path, "train.jsonl", sha256=sha256))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_corpus_record_names_each_split_by_its_files_sha256(tmp_path):
    train = write_docs(tmp_path / "train.jsonl", 20, "abc", seed=0)
    val = write_docs(tmp_path / "val.jsonl", 5, "abc", seed=1)
    cfg = _config(tmp_path, train, val)
    cfg["sources"]["unused"] = {"train": str(train)}
    cfg["phases"] = [{"start": 0.0, "weights": {"kjv": 1.0}}]
    assert corpus_record(cfg) == {"kjv/train": sha256_file(train)[:16], "kjv/val": sha256_file(val)[:16]}
    several = corpus_record(_config(tmp_path, [str(train), str(val)]))["kjv/train"]
    assert len(several) == 16 and several not in (sha256_file(train)[:16], sha256_file(val)[:16])


def _build_corpora():
    spec = importlib.util.spec_from_file_location("build_corpora", REPO / "scripts" / "build_corpora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_prints_each_files_hash_and_whether_it_matches_the_pin(tmp_path, capsys):
    corpora = tmp_path / "corpora"
    for name in ("kjv", "foldoc", "code"):
        (corpora / name).mkdir(parents=True)
        write_docs(corpora / name / "train.jsonl.gz", 5, "abc", seed=len(name))  # only hashed, never read
    kjv, foldoc = sha256_file(corpora / "kjv" / "train.jsonl.gz"), sha256_file(corpora / "foldoc" / "train.jsonl.gz")
    config = tmp_path / "pinned.yaml"
    sources = {
        "kjv": {"train": "data/corpora/kjv/train.jsonl.gz", "sha256": {"train": kjv}},
        "foldoc": {"train": "data/corpora/foldoc/train.jsonl.gz", "sha256": {"train": "f" * 64}},
        "code": {"train": "data/corpora/code/train.jsonl.gz"},
        "math": {"train": "data/corpora/math/train.jsonl.gz", "sha256": {"train": "e" * 64}},
    }
    config.write_text(yaml.safe_dump({"tokenizer": "bpe8k", "sources": sources}, sort_keys=False))
    build = _build_corpora()
    assert build.check_corpora(config, corpora) == 1  # one differs, one is missing
    out = capsys.readouterr().out.splitlines()
    assert any(
        line.split()[:4] == ["kjv/train", str(corpora / "kjv/train.jsonl.gz"), kjv[:16], "matches"] for line in out
    )
    differs = next(line for line in out if line.strip().startswith("foldoc/train"))
    assert f"{foldoc[:16]} DIFFERS from the pinned ffffffffffffffff" in differs
    assert "not pinned" in next(line for line in out if line.strip().startswith("code/train"))
    assert "missing" in next(line for line in out if line.strip().startswith("math/train"))
    # the lines to paste: the unpinned source with its hash, the others as they are
    block = yaml.safe_load("\n".join(out[out.index("sources:") :]))
    assert block["sources"]["code"]["sha256"] == {"train": sha256_file(corpora / "code" / "train.jsonl.gz")}
    assert block["sources"]["kjv"] == sources["kjv"] and block["sources"]["foldoc"] == sources["foldoc"]

    # the command line: --check alone builds nothing, and says the same
    proc = subprocess.run(
        [sys.executable, "scripts/build_corpora.py", "--check", "--data-config", str(config), "--out", str(corpora)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "DIFFERS" in proc.stdout and "downloading" not in proc.stdout + proc.stderr


def test_the_reproduction_config_parses_with_or_without_pins():
    cfg = yaml.safe_load((REPO / "configs" / "data" / "repro30m.yaml").read_text())
    parsed = parse_data_config(cfg)
    assert len(parsed.sources) == 9


def test_cached_only_finds_prepared_shards_and_tokenizes_nothing(tmp_path):
    """What `reproduce plan` uses for its passes over the data: the cache's current shards, else nothing."""
    train = write_docs(tmp_path / "train.jsonl", 20, "abc", seed=0)
    cfg = _config(tmp_path, train)
    assert prepare_all(cfg, splits=("train",), cached_only=True) == {}
    assert _tree(tmp_path / "cache") == []  # nothing made
    built = prepare_all(cfg, splits=("train",))["kjv/train"]
    assert prepare_all(cfg, splits=("train",), cached_only=True) == {"kjv/train": built}
    write_docs(train, 21, "abc", seed=0)  # other inputs: those shards are not theirs
    assert prepare_all(cfg, splits=("train",), cached_only=True) == {}
