"""Paths a user names from their own folder: prepare's --out lands there, a missing input names every place
looked in, and a jsonl keyed otherwise than `text` says which key to set."""

import gzip
import json
import subprocess
import sys

import pytest

from nvfp4train.data.inputs import expand_inputs, iter_documents
from nvfp4train.data.paths import REPO_ROOT
from tests.conftest import cli_env


def test_prepare_writes_a_relative_out_under_the_working_directory(tmp_path):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(5)))
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.data.prepare", "--input", "docs.jsonl", "--out", "shards/web/train",
         "--num-proc", "1"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "shards" / "web" / "train" / "manifest.json").is_file()
    assert not (REPO_ROOT / "shards").exists()


def test_a_missing_input_names_the_repository_and_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        expand_inputs("x.jsonl", "data.sources.own.train")
    assert (
        str(e.value)
        == f"data.sources.own.train: input file not found: {REPO_ROOT / 'x.jsonl'} nor {tmp_path / 'x.jsonl'}"
    )


def test_a_jsonl_keyed_body_says_which_text_field_to_set(tmp_path):
    path = tmp_path / "web.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"id": 7, "title": "A", "body": "the document itself, longer than its title"}) + "\n")
    with pytest.raises(ValueError) as e:
        list(iter_documents(str(path), key="data.sources.web.train"))
    assert str(e.value) == (
        f"{path}:1: no 'text' field (its fields: id, title, body); set data.sources.web.text_field=body"
    )
    with pytest.raises(ValueError, match=r"; set --text-field body$"):  # prepare's command line
        list(iter_documents(str(path), key="input"))
    assert list(iter_documents(str(path), text_field="body", key="data.sources.web.train")) == [
        "the document itself, longer than its title"
    ]


def test_a_missing_built_corpus_says_how_to_build_it(tmp_path, monkeypatch):
    """configs/data/corpora.yaml (the reproduction's data) names data/corpora/, which a clone does not have."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"; build the corpora first: python scripts/build_corpora.py "
                       r"--corpora$"):  # fmt: skip
        expand_inputs("data/corpora/nowhere/train.jsonl.gz", "data.sources.nowhere.train")
