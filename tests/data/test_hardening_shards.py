"""Hardening, round 3 (issue 61): prepared shards that lie. A manifest's fields and a shard's document index
are checked like the shards themselves (types, the tokenizer's dtype/vocab/EOS, the index's sha256 and
offsets, EOS at every document's end); a damaged cache file is rebuilt with a warning naming it; a parquet
text column that is not strings, and Ctrl-C in `python -m nvfp4train.data.prepare`, are one line each."""

import hashlib
import json
import logging
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from nvfp4train.data import build_train_loader
from nvfp4train.data import prepare as prepare_mod
from tests.conftest import REPO, cli_env

ARGS = dict(seq_len=32, global_batch_size=8, micro_batch_size=2, rank=0, world_size=1, seed=0, total_samples=100)


def build(cfg):
    return build_train_loader(cfg, **ARGS)


def _manifest(out) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _write_manifest(out, manifest) -> None:
    (out / "manifest.json").write_text(json.dumps(manifest))


def _write_index(out, offsets, *, update_sha=True) -> None:
    """Replace shard 0's index; with update_sha its index_sha256 in the manifest is made to agree, so that
    only the checks of the offsets themselves stand between the lie and training."""
    index = out / "shard_00000.idx.npy"
    np.save(index, np.asarray(offsets))
    if update_sha:
        manifest = _manifest(out)
        manifest["shards"][0]["index_sha256"] = hashlib.sha256(index.read_bytes()).hexdigest()
        _write_manifest(out, manifest)


def _offsets(out) -> np.ndarray:
    return np.load(out / "shard_00000.idx.npy")


# ----------------------------------------------------------------------------- (1) the index
def _swap(o):
    o[3], o[4] = o[4], o[3]
    return o


def _past_the_end(o):
    o[5] = o[-1] + 1000
    return o


def _short_of_the_end(o):
    o[-1] -= 1
    return o


def _not_at_eos(o):
    o[5] += 1  # a boundary inside a document: the shard's token before it is not EOS
    return o


@pytest.mark.parametrize(
    "scramble, match",
    [
        (_swap, r"offsets must rise strictly from 0 to shards\[0\]\.n_tokens = \d+ .*not always rising"),
        (_past_the_end, r"offsets must rise strictly .*not always rising"),
        (_short_of_the_end, r"offsets must rise strictly from 0 to shards\[0\]\.n_tokens = \d+ \(they run from 0 to"),
        (_not_at_eos, r"does not match .*shard_00000.bin: document 4 ends at token \d+, which is not EOS \(0\)"),
    ],
    ids=["non-monotonic", "out-of-range", "not-ending-at-n_tokens", "boundary-inside-a-document"],
)
def test_a_scrambled_index_is_refused_before_training(prepared, scramble, match):
    corpus, out = prepared
    _write_index(out, scramble(_offsets(out)))
    with pytest.raises(ValueError, match=r"shard_00000\.idx\.npy.*" + match) as err:
        build(corpus)
    assert "prepare the shards again" in str(err.value) and "\n" not in str(err.value)


def test_an_index_edited_without_its_checksum_is_refused(prepared):
    corpus, out = prepared
    _write_index(out, _swap(_offsets(out)), update_sha=False)
    with pytest.raises(
        ValueError, match=r"shard_00000\.idx\.npy: its sha256 is not shards\[0\]\.index_sha256 in .*manifest\.json"
    ):
        build(corpus)


# ----------------------------------------------------------------------------- (1) the manifest's fields
@pytest.mark.parametrize("dtype", ["<f2", "|b1", "<i2", "V2", "<u4", "float16"])
def test_a_manifest_dtype_other_than_the_tokenizers_is_refused(prepared, dtype):
    corpus, out = prepared
    manifest = _manifest(out)
    manifest["dtype"] = dtype
    _write_manifest(out, manifest)
    with pytest.raises(
        ValueError,
        match=rf"manifest\.json: field dtype is '{dtype}', allowed: '<u2' for vocab_size <= 65536, "
        r"'<u4' above \(vocab_size is 8192\)",
    ):
        build(corpus)


@pytest.mark.parametrize(
    "field, lie, match",
    [
        # a larger vocab_size would let ids past the model's 8192-row embedding through the id check
        ("vocab_size", 60000, r"field vocab_size is 60000, but tokenizer tokenizers:\w+ \(data.tokenizer\) has "),
        ("eos_id", 5, r"field eos_id is 5, but tokenizer .* has eos_id 0"),
        ("eos_id", 9000, r"field eos_id is 9000, vocab_size 8192: expected 0 <= eos_id < vocab_size"),
        ("n_tokens", 12, r"field n_tokens is 12, but its shards hold \d+"),
    ],
)
def test_a_manifest_field_that_lies_is_refused(prepared, field, lie, match):
    corpus, out = prepared
    manifest = _manifest(out)
    manifest[field] = lie
    _write_manifest(out, manifest)
    with pytest.raises(ValueError, match=r"manifest\.json: " + match):
        build(corpus)


# ----------------------------------------------------------------------------- (2) a consistent n_docs lie
def _merge_last_two_documents(out) -> None:
    """n_docs one smaller in the manifest and the shard, and an index that agrees with both (every
    boundary still after an EOS): only the index's checksum tells."""
    offsets = _offsets(out)
    manifest = _manifest(out)
    manifest["n_docs"] -= 1
    manifest["shards"][0]["n_docs"] -= 1
    _write_manifest(out, manifest)
    _write_index(out, np.delete(offsets, -2), update_sha=False)


def test_a_consistent_lie_about_the_number_of_documents_is_refused(prepared):
    corpus, out = prepared
    _merge_last_two_documents(out)
    with pytest.raises(ValueError, match=r"shard_00000\.idx\.npy: its sha256 is not shards\[0\]\.index_sha256"):
        build(corpus)


def test_training_does_not_start_on_a_lie_about_the_number_of_documents(prepared, tmp_path):
    _, out = prepared
    _merge_last_two_documents(out)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            "model=hybrid_tiny",
            "data=own",
            "data.sources.own.train=null",
            f"+data.sources.own.shards={out}",
            "data.sources.own.val=null",
            "train.eval_sequences=0",
            "train.max_steps=2",
            "train.progress=false",
            f"out_dir={run_dir}",
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "shard_00000.idx.npy: its sha256 is not shards[0].index_sha256" in lines[0]
    assert not (run_dir / "metrics.jsonl").exists()


# ----------------------------------------------------------------------------- (4) damaged files
def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_damaged_manifests_of_a_shards_source_are_one_line(prepared):
    corpus, out = prepared
    (out / "manifest.json").write_text(_nested(100_000))
    with pytest.raises(
        ValueError, match=r"manifest\.json is not a shard manifest \(a JSON object\) \(nested too deep\)"
    ):
        build(corpus)


@pytest.mark.parametrize(
    "damage, names",
    [
        (lambda d: _edit_json(d / "manifest.json", dtype="V2"), "manifest.json: field dtype is 'V2'"),
        (lambda d: (d / "manifest.json").write_text(_nested(100_000)), "manifest.json is not a shard manifest"),
        (lambda d: _write_index(d, _swap(_offsets(d))), "shard_00000.idx.npy: offsets must rise strictly"),
    ],
    ids=["V2-dtype", "nested-100000-deep", "scrambled-index"],
)
def test_a_damaged_cache_directory_is_rebuilt_with_a_warning_naming_the_file(corpus, caplog, damage, names):
    (split,) = prepare_mod.prepare_all(corpus, splits=("train",), names=["upper"]).values()
    good = {p.name: p.read_bytes() for p in split.iterdir()}
    damage(split)
    with caplog.at_level(logging.WARNING, logger="nvfp4train.data.prepare"):
        build(corpus)  # trains on the rebuilt shards
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(split) in warnings[0] and names in warnings[0], warnings
    assert "preparing" in warnings[0] and "again from its inputs" in warnings[0]
    assert {p.name: p.read_bytes() for p in split.iterdir()} == good


def _edit_json(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def _interrupted_build(src, out, monkeypatch, after_docs=150):
    """A build of `src` stopped by Ctrl-C after `after_docs` documents (docs_per_shard 64: two shards kept)."""
    real_iter = prepare_mod.iter_documents

    def stops(*args, **kwargs):
        for i, doc in enumerate(real_iter(*args, **kwargs)):
            if i == after_docs:
                raise KeyboardInterrupt
            yield doc

    monkeypatch.setattr(prepare_mod, "iter_documents", stops)
    with pytest.raises(prepare_mod.PrepareInterrupted):
        prepare_mod.prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=64, progress=False)
    monkeypatch.setattr(prepare_mod, "iter_documents", real_iter)


@pytest.mark.parametrize(
    "progress, names",
    [
        ("[]", "progress.json is not a shard build's progress (a JSON object with header and shards)"),
        ('{"header": 1, "shards": {}}', "progress.json is not a shard build's progress"),
        (_nested(100_000), "progress.json is not a shard build's progress (a JSON object) (nested too deep)"),
        ("\xff\xfe", "progress.json is not a shard build's progress (a JSON object)"),
    ],
    ids=["a-list", "shards-not-a-list", "nested-100000-deep", "not-json"],
)
def test_a_damaged_progress_file_restarts_the_build_with_a_warning(
    corpus, tmp_path, monkeypatch, caplog, progress, names
):
    src = corpus["sources"]["lower"]["train"]
    prepare_mod.prepare_split(src, tmp_path / "ref", tokenizer="bpe8k", docs_per_shard=64, progress=False)
    out = tmp_path / "out"
    _interrupted_build(src, out, monkeypatch)
    (out / "progress.json").write_text(progress)
    with caplog.at_level(logging.WARNING, logger="nvfp4train.data.prepare"):
        prepare_mod.prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=64, progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and names in warnings[0] and "again from the first document" in warnings[0], warnings
    shards = lambda d: {p.name: p.read_bytes() for p in d.iterdir() if p.name.startswith("shard_")}  # noqa: E731
    assert shards(out) == shards(tmp_path / "ref") and not (out / "progress.json").exists()


def test_a_progress_file_recording_a_shard_that_is_not_on_disk_restarts_the_build(
    corpus, tmp_path, monkeypatch, caplog
):
    src = corpus["sources"]["lower"]["train"]
    out = tmp_path / "out"
    _interrupted_build(src, out, monkeypatch)
    np.save(out / "shard_00001.idx.npy", np.arange(3))  # replaced after progress.json recorded it
    with caplog.at_level(logging.WARNING, logger="nvfp4train.data.prepare"):
        prepare_mod.prepare_split(src, out, tokenizer="bpe8k", docs_per_shard=64, progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "shard_00001.idx.npy: its sha256 is not shards[1].index_sha256" in warnings[0]
    assert build_train_loader  # the rebuilt directory opens
    from nvfp4train.data import TokenShards

    assert TokenShards(out).n_docs == 300


# ----------------------------------------------------------------------------- (3) parquet text columns
def _prepare_cli(capsys, *args) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exit_:
        prepare_mod.main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return exit_.value.code, err.strip().splitlines()


@pytest.mark.parametrize(
    "column, match",
    [
        ([1, 2, 3], r"column 'text' holds int64, not strings"),
        ([["a"], ["b"]], r"column 'text' holds list<\w+: string>, not strings"),
        (["first", None, "third"], r"column 'text' has no value \(null\) in row 1"),
    ],
    ids=["ints", "lists", "nulls"],
)
def test_a_parquet_text_column_that_is_not_strings_is_one_line(tmp_path, capsys, column, match):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": column}), path)
    out = tmp_path / "out"
    code, lines = _prepare_cli(capsys, "--input", str(path), "--out", str(out), "--num-proc", "1")
    assert code == 2 and len(lines) == 1, lines
    assert re.match(rf"error: {re.escape(str(path))}: {match}; input needs text", lines[0]), lines[0]
    assert not out.exists()


def test_a_parquet_file_without_the_column_or_not_parquet_is_one_line(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": ["a b c"]}), path)
    code, lines = _prepare_cli(capsys, "--input", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and lines == [f"error: {path}: no 'text' column (columns: body); set text_field"]
    path.write_bytes(b"PAR1 not really")
    code, lines = _prepare_cli(capsys, "--input", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}: unreadable ("), lines
    assert lines[0].endswith("input must name readable parquet files")


# ----------------------------------------------------------------------------- (5) Ctrl-C in data.prepare
def test_ctrl_c_during_prepare_exits_130_in_one_line_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "shards"
    cmd = [
        sys.executable,
        "-m",
        "nvfp4train.data.prepare",
        "--input",
        str(REPO / "data" / "bundled" / "code.train.jsonl.gz"),  # 396 documents, 1.1 M tokens
        "--out",
        str(out),
        "--docs-per-shard",
        "20",
        "--num-proc",
        "1",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "progress.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, "the build finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    kept = json.loads((out / "progress.json").read_text())["shards"]
    assert lines[0] == (
        f"interrupted: the {len(kept)} finished shard(s) of {out} are kept (progress.json); "
        "run the same command again to resume after them"
    )
    assert not list(out.glob("*.tmp")) and not (out / "manifest.json").exists()  # nothing half-written to trust
    stamps = {s["file"]: (out / s["file"]).stat().st_mtime_ns for s in kept}
    rerun = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert stamps == {name: (out / name).stat().st_mtime_ns for name in stamps}  # resumed after them
    from nvfp4train.data import TokenShards

    assert TokenShards(out, verify_checksums=True).n_docs == _manifest(out)["n_docs"]


def _prepare_cmd(out) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nvfp4train.data.prepare",
        "--input",
        str(REPO / "data" / "bundled" / "code.train.jsonl.gz"),  # 396 documents, 1.1 M tokens
        "--out",
        str(out),
        "--docs-per-shard",
        "20",
        "--num-proc",
        "1",
    ]


def test_sigterm_during_prepare_exits_143_in_one_line_and_trusts_no_half_written_shard(tmp_path):
    out = tmp_path / "shards"
    proc = subprocess.Popen(
        _prepare_cmd(out), cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "progress.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, "the build finished before it could be stopped"
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert time.monotonic() - t0 < 15
    lines = err.strip().splitlines()
    assert proc.returncode == 143 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    kept = json.loads((out / "progress.json").read_text())["shards"]
    assert lines[0] == (
        f"terminated (SIGTERM): the {len(kept)} finished shard(s) of {out} are kept (progress.json); "
        "run the same command again to resume after them"
    )
    assert not list(out.glob("*.tmp")) and not (out / "manifest.json").exists()
    rerun = subprocess.run(_prepare_cmd(out), cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    from nvfp4train.data import TokenShards

    assert TokenShards(out, verify_checksums=True).n_docs == _manifest(out)["n_docs"]


def test_sigterm_while_waiting_for_another_prepare_exits_143_in_one_line(tmp_path):
    """Another process holds the directory's lock (it is building the shards): the waiting one stops on
    SIGTERM at once and builds nothing."""
    import fcntl

    out = tmp_path / "shards"
    with open(tmp_path / ".shards.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            _prepare_cmd(out), cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 120
            while not any(f" {proc.pid} " in line and "->" in line for line in open("/proc/locks")):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 143, err[-3000:]
    assert err.strip() == (
        "terminated (SIGTERM): no shard was being written; run the same command again to prepare the shards"
    )
    assert not out.exists()


def test_a_file_size_limit_is_named_not_numpys_byte_counts(tmp_path):
    import resource

    out = tmp_path / "shards"
    limit = 64 * 1024  # below one shard of 20 documents

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        _prepare_cmd(out),
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0] == f"error: {out}: cannot write (file-size limit reached: see ulimit -f)"
    assert "requested" not in lines[0] and "None" not in lines[0]


def test_why_not_written_names_a_full_disk_for_a_short_write_without_a_limit():
    import resource

    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        pytest.skip("this process runs under a file-size limit")
    short_write = OSError("950626 requested and 128000 written")  # numpy's tofile: no errno, no file name
    assert prepare_mod.why_not_written(short_write) == "no space left on the device"


def test_a_tokenizer_that_is_a_fifo_is_not_a_regular_file_not_missing(tmp_path):
    import os

    from nvfp4train.data.tokenizer import load_tokenizer

    fifo = tmp_path / "tok.json"
    os.mkfifo(fifo)
    with pytest.raises(FileNotFoundError) as refused:
        load_tokenizer(str(fifo))  # must not open it: reading a FIFO blocks until a writer comes
    assert str(refused.value) == f"tokenizer {fifo} is not a regular file (data.tokenizer={str(fifo)!r})"
