import json

import numpy as np
import pytest

from nvfp4train.data import TokenShards, prepare_split
from nvfp4train.data import prepare as prepare_mod


def shard_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name.startswith("shard_")}


def test_documents_round_trip_with_eos(corpus, tmp_path, tokenizer):
    src = corpus["sources"]["digits"]["train"]
    out = tmp_path / "shards"
    manifest = prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=40, progress=False)
    texts = [json.loads(line)["text"] for line in open(src)]
    shards = TokenShards(out, expected_tokenizer=tokenizer.identity, verify_checksums=True)
    assert shards.n_docs == len(texts) == manifest["n_docs"] and len(manifest["shards"]) == 4
    assert shards.dtype == np.dtype("<u2")                    # vocab 8192 fits in uint16
    for i in (0, 39, 40, len(texts) - 1):                     # across shard boundaries
        doc = shards.document(i).tolist()
        assert doc[-1] == tokenizer.eos_id and tokenizer.decode(doc[:-1]) == texts[i]


def test_idempotent_and_rebuilt_when_inputs_change(corpus, tmp_path):
    src = corpus["sources"]["digits"]["train"]
    out = tmp_path / "shards"
    prepare_split(src, out, tokenizer="bpe8k", progress=False)
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    prepare_split(src, out, tokenizer="bpe8k", progress=False)
    assert stamp == {p.name: p.stat().st_mtime_ns for p in out.iterdir()}     # nothing rewritten
    with open(src, "a") as f:
        f.write(json.dumps({"text": "123 456"}) + "\n")
    manifest = prepare_split(src, out, tokenizer="bpe8k", progress=False)
    assert manifest["n_docs"] == 151


def test_several_processes_give_identical_shards(corpus, tmp_path):
    src = corpus["sources"]["lower"]["train"]
    prepare_split(src, tmp_path / "one", tokenizer="bpe8k", num_proc=1, docs_per_shard=100, progress=False)
    prepare_split(src, tmp_path / "two", tokenizer="bpe8k", num_proc=2, docs_per_shard=100, progress=False)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")


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
    assert len(finished) == 3                                   # 192 of 200 documents were sealed
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("shard_0000[0-2].bin")}
    monkeypatch.setattr(prepare_mod, "iter_documents", real_iter)
    prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=64, progress=False)
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("shard_0000[0-2].bin")}   # kept
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
    prepare_split(str(tmp_path / "d.parquet"), tmp_path / "out", tokenizer="bpe8k", text_field="content",
                  progress=False)
    assert TokenShards(tmp_path / "out").n_docs == 2


def test_command_line(corpus, tmp_path):
    import subprocess
    import sys

    from nvfp4train.data.paths import REPO_ROOT

    out = tmp_path / "cli"
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), "--input",
                          corpus["sources"]["upper"]["train"], "--out", str(out), "--num-proc", "1"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "60 documents" in run.stdout and TokenShards(out).n_docs == 60
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), "--input",
                          str(tmp_path / "nope.jsonl"), "--out", str(out)], capture_output=True, text=True)
    assert run.returncode != 0 and "nope.jsonl" in run.stderr
