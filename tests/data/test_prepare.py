import json
import os
import shutil
import time

import numpy as np
import pytest

from nvfp4train.data import TokenShards, build_train_loader, prepare_all, prepare_split
from nvfp4train.data import prepare as prepare_mod
from nvfp4train.data.prepare import ordered_map


def shard_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name.startswith("shard_")}


def test_documents_round_trip_with_eos(corpus, tmp_path, tokenizer):
    src = corpus["sources"]["digits"]["train"]
    out = tmp_path / "shards"
    manifest = prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=40, progress=False)
    texts = [json.loads(line)["text"] for line in open(src)]
    shards = TokenShards(out, expected_tokenizer=tokenizer.identity, verify_checksums=True)
    assert shards.n_docs == len(texts) == manifest["n_docs"] and len(manifest["shards"]) == 4
    assert shards.dtype == np.dtype("<u2")  # vocab 8192 fits in uint16
    for i in (0, 39, 40, len(texts) - 1):  # across shard boundaries
        doc = shards.document(i).tolist()
        assert doc[-1] == tokenizer.eos_id and tokenizer.decode(doc[:-1]) == texts[i]


def test_idempotent_and_rebuilt_when_inputs_change(corpus, tmp_path):
    src = corpus["sources"]["digits"]["train"]
    out = tmp_path / "shards"
    prepare_split(src, out, tokenizer="bpe8k", progress=False)
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    prepare_split(src, out, tokenizer="bpe8k", progress=False)
    assert stamp == {p.name: p.stat().st_mtime_ns for p in out.iterdir()}  # nothing rewritten
    with open(src, "a") as f:
        f.write(json.dumps({"text": "123 456"}) + "\n")
    manifest = prepare_split(src, out, tokenizer="bpe8k", progress=False)
    assert manifest["n_docs"] == 151


def test_several_threads_give_identical_shards_and_fork_nothing(corpus, tmp_path, monkeypatch):
    """num_proc tokenizes on threads: a fork of this (threaded) process could inherit a lock that one of
    its threads holds and wait on it forever (seen: a pool's workers stuck in encode_batch)."""
    src = corpus["sources"]["lower"]["train"]
    prepare_split(src, tmp_path / "one", tokenizer="bpe8k", num_proc=1, docs_per_shard=100, progress=False)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("prepare_split forked"))
    monkeypatch.setattr(os, "posix_spawn", lambda *a, **k: pytest.fail("prepare_split started a process"))
    prepare_split(src, tmp_path / "two", tokenizer="bpe8k", num_proc=3, docs_per_shard=100, progress=False)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")


def test_ordered_map_keeps_the_order_and_bounds_what_is_in_flight():
    started, done = [], []

    def work(i):
        started.append(i)
        time.sleep(0.02 * (5 - i % 5))  # later items finish first
        done.append(i)
        return i * i

    results = ordered_map(work, range(20), workers=3, window=4)
    assert next(results) == 0 and len(started) <= 4  # a window of 4: the rest waits for the consumer
    assert list(results) == [i * i for i in range(1, 20)]


def test_interrupted_build_resumes_after_finished_shards(corpus, tmp_path, monkeypatch):
    src = corpus["sources"]["lower"]["train"]
    prepare_split(src, tmp_path / "ref", tokenizer="bpe8k", docs_per_shard=64, progress=False)
    real_iter = prepare_mod.iter_documents

    def dies_after(n):
        def fake(*args, **kwargs):
            for i, doc in enumerate(real_iter(*args, **kwargs)):
                if i == n:
                    raise KeyboardInterrupt
                yield doc

        return fake

    out = tmp_path / "resumed"
    monkeypatch.setattr(prepare_mod, "iter_documents", dies_after(200))
    with pytest.raises(KeyboardInterrupt):
        prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=64, progress=False)
    assert not (out / "manifest.json").exists()
    finished = json.loads((out / "progress.json").read_text())["shards"]
    assert len(finished) == 3  # 192 of 200 documents were sealed
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("shard_0000[0-2].bin")}
    monkeypatch.setattr(prepare_mod, "iter_documents", real_iter)
    prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=64, progress=False)
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("shard_0000[0-2].bin")}  # kept
    assert shard_bytes(out) == shard_bytes(tmp_path / "ref")


def test_text_files_and_directories(tmp_path, tokenizer):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("first document")
    (docs / "b.txt").write_text("second one")
    (docs / "ignored.bin").write_bytes(b"\x00")
    prepare_split(str(docs), tmp_path / "out", tokenizer="bpe8k", progress=False)
    shards = TokenShards(tmp_path / "out")
    assert [tokenizer.decode(shards.document(i).tolist()[:-1]) for i in range(2)] == ["first document", "second one"]


def test_parquet_input(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["alpha beta", "gamma"]}), tmp_path / "d.parquet")
    prepare_split(
        str(tmp_path / "d.parquet"), tmp_path / "out", tokenizer="bpe8k", text_field="content", progress=False
    )
    assert TokenShards(tmp_path / "out").n_docs == 2


def test_command_line(corpus, tmp_path):
    import subprocess
    import sys

    from nvfp4train.data.paths import REPO_ROOT

    out = tmp_path / "cli"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "prepare_data.py"),
            "--input",
            corpus["sources"]["upper"]["train"],
            "--out",
            str(out),
            "--num-proc",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "60 documents" in run.stdout and TokenShards(out).n_docs == 60
    run = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "prepare_data.py"),
            "--input",
            str(tmp_path / "nope.jsonl"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "nope.jsonl" in run.stderr


# `datasets` inputs ({hf: ...}): the same loading code as for a hub dataset, on data `datasets` wrote or
# reads locally, so it runs offline (HF_DATASETS_OFFLINE=1).
def test_datasets_inputs_saved_locally_give_the_same_shards_as_the_files(corpus, tmp_path):
    datasets = pytest.importorskip("datasets")
    src = corpus["sources"]["digits"]["train"]
    rows = [json.loads(line) for line in open(src)]
    texts = [r["text"] for r in rows]
    table = datasets.Dataset.from_dict({"id": list(range(len(texts))), "text": texts})
    table.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": table.select(range(10)), "validation": table}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "pq").mkdir()
    table.to_parquet(str(tmp_path / "pq" / "train-00000-of-00001.parquet"))

    prepare_split(src, tmp_path / "ref", tokenizer="bpe8k", docs_per_shard=64, progress=False)
    specs = {
        "save_to_disk": {"hf": str(tmp_path / "saved")},
        "save_to_disk_dict": {"hf": str(tmp_path / "dict"), "split": "validation"},
        "parquet_dir": {"hf": str(tmp_path / "pq")},
        "json_builder": {"hf": "json", "data_files": [src]},
    }
    for name, spec in specs.items():
        manifest = prepare_split(spec, tmp_path / name, tokenizer="bpe8k", docs_per_shard=64, progress=False)
        assert manifest["n_docs"] == len(texts), name
        assert shard_bytes(tmp_path / name) == shard_bytes(tmp_path / "ref"), name

    # Local data is fingerprinted by content: saving the dataset again with a row more rebuilds.
    datasets.Dataset.from_dict({"id": list(range(len(texts) + 1)), "text": texts + ["123 456"]}).save_to_disk(
        str(tmp_path / "saved2")
    )
    shutil.rmtree(tmp_path / "saved")
    shutil.move(tmp_path / "saved2", tmp_path / "saved")
    manifest = prepare_split(specs["save_to_disk"], tmp_path / "save_to_disk", tokenizer="bpe8k", progress=False)
    assert manifest["n_docs"] == len(texts) + 1


def test_datasets_input_through_a_data_config_and_its_errors(tmp_path, tokenizer):
    datasets = pytest.importorskip("datasets")
    saved = str(tmp_path / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": ["alpha beta gamma " * 40] * 30})}).save_to_disk(
        saved
    )

    def data_config(spec, text_field="body"):
        return {
            "tokenizer": "bpe8k",
            "cache_dir": str(tmp_path / "cache"),
            "sources": {"local": {"train": spec, "text_field": text_field}},
        }

    loader = build_train_loader(
        data_config({"hf": saved}),
        seq_len=32,
        global_batch_size=2,
        micro_batch_size=2,
        rank=0,
        world_size=1,
        seed=0,
        total_samples=10,
    )
    x, _ = loader.next_microbatch()
    text = tokenizer.decode(x.flatten().tolist()).replace("<|endoftext|>", "")
    assert "beta gamma alpha" in text and set(text) <= set("alpha beta gamma")

    def error(spec, text_field="body"):
        """The one-line error prepare_all gives for this source."""
        with pytest.raises(ValueError) as e:
            prepare_all(data_config(spec, text_field), splits=("train",))
        assert "\n" not in str(e.value) and str(e.value).startswith("data.sources.local.train")
        return str(e.value)

    assert "no 'text' column (columns: body)" in error({"hf": saved}, text_field="text")
    assert "unknown: ['revision']" in error({"hf": saved, "revision": "main"})
    assert f"split='test': {saved} has splits train" in error({"hf": saved, "split": "test"})
    assert "cannot load it" in error({"hf": "no-such-org/no-such-dataset"})
