"""Raw documents -> token shards (see shards.py for the format).

    python -m nvfp4train.data.prepare --input 'corpus/*.jsonl.gz' --tokenizer bpe8k --out shards/web/train
    python scripts/prepare_data.py --config configs/data/bundled.yaml          # every source of a data config

Inputs: local .jsonl/.jsonl.gz/.json (one JSON object per line, text in `text_field`), .txt/.txt.gz
(one document per file), .parquet, a directory or glob of those, or a `datasets` dataset
({hf: ..., name: config, split: train, data_files: ...}): a hub name where a hub is reachable, a
directory written by `save_to_disk`, a directory of data files, or a builder (json, parquet) with
data_files. Several threads tokenize (`num_proc`; the tokenizers release the GIL), in order, so the result
does not depend on their number.

Idempotent: a finished directory whose manifest matches the inputs (sizes + sha256) and the tokenizer
is left alone; one whose manifest or index is damaged is built again (a warning names the file).
Resumable: every `docs_per_shard` input documents a shard is finished and recorded in progress.json; a
restarted build (after Ctrl-C or SIGTERM, which exit 130 and 143) skips those documents and continues with
the next shard.
Reading the inputs is inputs.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml
from tqdm.auto import tqdm

from .config import DataConfig, parse_data_config
from .inputs import expand_inputs, inputs_fingerprint, iter_documents
from .paths import resolve_path
from .shards import (
    FORMAT_VERSION,
    MANIFEST,
    PREPARE_AGAIN,
    SHARD_FIELDS,
    check_fields,
    read_index,
    read_json,
    read_manifest,
    sha256_file,
    token_dtype,
)
from .tokenizer import load_tokenizer

log = logging.getLogger(__name__)
PROGRESS = "progress.json"
BATCH_DOCS = 256


class PrepareInterrupted(KeyboardInterrupt):
    """Ctrl-C during a build, with what it kept: the shards progress.json records (a re-run resumes after
    them). Still a KeyboardInterrupt, so a caller that stops on Ctrl-C stops on this too."""

    def __init__(self, out_dir: Path, n_shards: int):
        super().__init__(f"{out_dir}: {n_shards} finished shard(s) kept")
        self.out_dir, self.n_shards = out_dir, n_shards


def why_not_written(e: OSError) -> str:
    """A failed write in the words run directories use (train/rundir.py), with the file where known. numpy's
    short write (`tofile`: "N requested and M written", no errno) is a full disk or the file-size limit."""
    from nvfp4train.train.rundir import WHY_NOT_WRITTEN  # here: only a failed write pays for its import

    why = WHY_NOT_WRITTEN.get(e.errno) or e.strerror
    if why is None and re.search(r"\d+ requested and \d+ written", str(e)):
        import resource

        limited = resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
        why = WHY_NOT_WRITTEN[errno.EFBIG if limited else errno.ENOSPC]
    return f"{why or e}: {e.filename}" if e.filename else str(why or e)


def _reason(err: Exception) -> str:
    """A refusal of shards.py without its advice, for a warning that says what is done instead."""
    return str(err).removesuffix(f"; {PREPARE_AGAIN}")


# ----------------------------------------------------------------------------- tokenizing
# Memory: a `tokenizers` encoding holds far more than the ids (token strings, offsets, masks): a 4 MB
# document encoded in one call peaked at 1.3 GB resident (tests/data/test_prepare_memory.py). Documents
# are therefore encoded in pieces of at most PIECE_CHARS characters and batches hold at most BATCH_CHARS
# characters, so a worker's memory is bounded whatever the size of one document; each piece's ids become
# a compact array at once.
PIECE_CHARS = 1 << 18
BATCH_CHARS = 1 << 20
# Where a long document is cut: just before a whitespace character that is followed by a non-space one.
# The GPT-2 pre-tokenizer regex (byte-level BPE: the bundled bpe8k and gpt2) always ends a pre-token
# there (`\s+(?!\S)` leaves the run's last whitespace character to the next pre-token), and BPE never
# merges across pre-tokens, so the pieces' tokens are exactly the whole document's. A newline is
# preferred; a piece with no such place at all (one 256 Ki-character "word") is cut at its length, and
# only there may the tokens differ from encoding the document whole.
_CUT_AT_LINE = re.compile(r"\n(?=\S)")
_CUT_AT_SPACE = re.compile(r"\s(?=\S)")


def split_document(text: str, piece_chars: int = PIECE_CHARS) -> list[str]:
    """`text` in pieces of at most `piece_chars` characters, cut where the pre-tokenizer splits anyway."""
    pieces, start = [], 0
    while len(text) - start > piece_chars:
        lo, hi = start + piece_chars // 2, start + piece_chars  # a cut in the piece's second half
        cut = None
        for pattern in (_CUT_AT_LINE, _CUT_AT_SPACE):
            for m in pattern.finditer(text, lo, hi):  # m.start() + 1 <= hi: the look-ahead stays in text
                cut = m.start()
            if cut is not None:
                break
        cut = cut if cut is not None and cut > start else hi
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def encode_documents(tok, texts: list[str], piece_chars: int = PIECE_CHARS) -> list[np.ndarray]:
    """Token ids of each document as an int64 array; a document longer than `piece_chars` is encoded
    piece by piece (split_document), so memory stays bounded."""
    out: list[np.ndarray | None] = [None] * len(texts)
    short = [i for i, text in enumerate(texts) if len(text) <= piece_chars]
    for i, ids in zip(short, tok.encode_batch([texts[i] for i in short]) if short else []):
        out[i] = np.asarray(ids, dtype=np.int64)
    for i, text in enumerate(texts):
        if out[i] is None:
            parts = [np.asarray(tok.encode(piece), dtype=np.int64) for piece in split_document(text, piece_chars)]
            out[i] = np.concatenate(parts)
    return out


def ordered_map(fn, items, workers: int, window: int):
    """fn(item) for each item on `workers` threads, yielded in the items' order, at most `window` in flight.
    Threads, not processes: the tokenizers' encoding releases the GIL, and a forked process inherits locks
    that the parent's other threads (the tokenizer's own thread pool, W&B's, tqdm's) may hold forever."""
    with ThreadPoolExecutor(workers, thread_name_prefix="tokenize") as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _batches(docs, size, max_chars: int = BATCH_CHARS):
    """Lists of at most `size` documents and (unless one document is longer) `max_chars` characters."""
    batch, chars = [], 0
    for doc in docs:
        if batch and chars + len(doc) > max_chars:
            yield batch
            batch, chars = [], 0
        batch.append(doc)
        chars += len(doc)
        if len(batch) == size:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


@contextlib.contextmanager
def _locked(out_dir: Path):
    """Only one process builds a directory; others wait, then find it finished."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _why_not_current(out_dir: Path, tok, fingerprint: dict) -> str | None:
    """None where out_dir holds the finished shards of these inputs made with `tok`. Otherwise why not:
    "" for nothing finished there or shards of other inputs (a plain rebuild), a sentence naming the file
    for a damaged one (a manifest or index that fails shards.py's checks, a .bin of the wrong size)."""
    if not (out_dir / MANIFEST).exists():
        return ""
    try:
        manifest = read_manifest(out_dir)
    except (FileNotFoundError, ValueError) as err:
        return _reason(err)
    if manifest["tokenizer"] != tok.identity or manifest.get("inputs") != fingerprint:
        return ""
    for field in ("vocab_size", "eos_id"):
        if manifest[field] != getattr(tok, field):
            return f"{out_dir / MANIFEST}: field {field} is {manifest[field]}, the tokenizer's is {getattr(tok, field)}"
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for i, shard in enumerate(manifest["shards"]):
        bin_path = out_dir / shard["file"]
        if not bin_path.is_file() or bin_path.stat().st_size != shard["n_tokens"] * itemsize:
            return f"{bin_path}: missing, or not the {shard['n_tokens'] * itemsize} bytes {out_dir / MANIFEST} says"
        try:
            read_index(out_dir, f"shards[{i}]", shard)
        except (FileNotFoundError, ValueError) as err:
            return _reason(err)
    return None


def prepare_split(
    spec,
    out_dir,
    *,
    tokenizer: str,
    text_field: str = "text",
    fmt: str | None = None,
    num_proc: int = 1,
    docs_per_shard: int = 100_000,
    key: str = "input",
    progress: bool | None = None,
    fingerprint: dict | None = None,
) -> dict:
    """Tokenize the documents of `spec` into shards under `out_dir`; return the manifest. `fingerprint`:
    inputs_fingerprint(spec, ...) when the caller has it already (it reads every input file)."""
    out_dir = resolve_path(out_dir)
    tok = load_tokenizer(tokenizer)
    fingerprint = fingerprint or inputs_fingerprint(spec, text_field, fmt, key)
    if _why_not_current(out_dir, tok, fingerprint) is None:
        return read_manifest(out_dir)
    with _locked(out_dir):
        why = _why_not_current(out_dir, tok, fingerprint)
        if why is None:  # another process finished it meanwhile
            return read_manifest(out_dir)
        if why:  # shards prepare made (a cache directory, an --out): made again from the inputs
            log.warning("%s; preparing %s again from its inputs", why, out_dir)
        return _build(spec, out_dir, tok, fingerprint, text_field, fmt, num_proc, docs_per_shard, key, progress)


def _build(spec, out_dir, tok, fingerprint, text_field, fmt, num_proc, docs_per_shard, key, progress):
    dtype = token_dtype(tok.vocab_size)
    header = {"tokenizer": tok.identity, "inputs": fingerprint, "docs_per_shard": docs_per_shard, "dtype": dtype.str}
    progress_path = out_dir / PROGRESS
    done = _finished_shards(out_dir, header, dtype)  # resume after the last finished shard
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)
    if not done:  # stale or foreign: start clean (only our own files go)
        for old in [*out_dir.glob("shard_*"), *out_dir.glob("*.tmp"), progress_path]:
            old.unlink(missing_ok=True)

    skip_docs = sum(s["n_input_docs"] for s in done)
    docs = iter_documents(spec, text_field=text_field, fmt=fmt, key=key)
    # progress=None: a bar only on a terminal; False: never.
    bar = tqdm(
        desc=f"tokenizing -> {out_dir}",
        unit="doc",
        initial=skip_docs,
        disable=True if progress is False else None,
        file=sys.stderr,
    )
    for _ in range(skip_docs):
        next(docs)

    batches = _batches(docs, min(BATCH_DOCS, docs_per_shard))
    if num_proc > 1:
        encoded_batches = ordered_map(lambda batch: encode_documents(tok, batch), batches, num_proc, 2 * num_proc)
    else:
        encoded_batches = (encode_documents(tok, batch) for batch in batches)

    chunks, offsets, n_input = [], [0], 0

    def flush():
        nonlocal chunks, offsets, n_input
        index = len(done)
        name = f"shard_{index:05d}"
        tokens = np.concatenate(chunks).astype(dtype) if chunks else np.zeros(0, dtype)
        tmp = out_dir / f"{name}.bin.tmp"
        tokens.tofile(tmp)
        os.replace(tmp, out_dir / f"{name}.bin")
        with open(out_dir / f"{name}.idx.npy.tmp", "wb") as f:
            np.save(f, np.asarray(offsets, dtype=np.int64))
        os.replace(out_dir / f"{name}.idx.npy.tmp", out_dir / f"{name}.idx.npy")
        done.append(
            {
                "file": f"{name}.bin",
                "index": f"{name}.idx.npy",
                "n_tokens": int(tokens.size),
                "n_docs": len(offsets) - 1,
                "n_input_docs": n_input,
                "sha256": sha256_file(out_dir / f"{name}.bin"),
                "index_sha256": sha256_file(out_dir / f"{name}.idx.npy"),
            }
        )
        (out_dir / f"{PROGRESS}.tmp").write_text(json.dumps({"header": header, "shards": done}))
        os.replace(out_dir / f"{PROGRESS}.tmp", progress_path)
        chunks, offsets, n_input = [], [0], 0

    try:
        for batch in encoded_batches:
            for ids in batch:
                n_input += 1
                if ids.size:  # empty documents carry no text: skip them
                    if ids.max() >= tok.vocab_size:
                        raise ValueError(f"token id {ids.max()} >= vocab size {tok.vocab_size}")
                    chunks.append(ids.astype(dtype))  # the shard's dtype: 2 bytes a token while the shard grows
                    chunks.append(np.array([tok.eos_id], dtype))
                    offsets.append(offsets[-1] + ids.size + 1)
                if n_input == docs_per_shard:
                    flush()
            bar.update(len(batch))
        if n_input or not done:
            flush()
    except KeyboardInterrupt:
        raise PrepareInterrupted(out_dir, len(done)) from None
    finally:
        bar.close()
        encoded_batches.close()  # on threads: the batches in flight finish, no new ones start
        for tmp in [*out_dir.glob("shard_*.tmp"), out_dir / f"{PROGRESS}.tmp"]:  # cut short: never renamed
            tmp.unlink(missing_ok=True)  # into place, and not left behind

    manifest = {
        "format_version": FORMAT_VERSION,
        **header,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "n_docs": sum(s["n_docs"] for s in done),
        "n_tokens": sum(s["n_tokens"] for s in done),
        "shards": done,
    }
    if manifest["n_tokens"] == 0:
        raise ValueError(f"{key}: no text in {spec!r} (empty source)")
    tmp = out_dir / f"{MANIFEST}.tmp"
    try:
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, out_dir / MANIFEST)
    except KeyboardInterrupt:
        raise PrepareInterrupted(out_dir, len(done)) from None
    finally:
        tmp.unlink(missing_ok=True)
    progress_path.unlink(missing_ok=True)
    return manifest


def _finished_shards(out_dir: Path, header: dict, dtype: np.dtype) -> list[dict]:
    """The shards that an interrupted build of the same header (tokenizer, inputs, shard size, dtype) recorded
    in progress.json, each checked as the manifest's are (fields, the .bin's size, the index); [] when there
    is none or another build's. A damaged progress.json, or a shard it records that is not on disk as
    recorded, also gives [] (the build starts again, said in a warning naming the file): nothing it says is
    trusted then, and the shards are this directory's own."""
    path = out_dir / PROGRESS
    if not path.exists():
        return []
    try:
        saved = read_json(path, "a shard build's progress (a JSON object)", PREPARE_AGAIN)
        if not isinstance(saved, dict) or not isinstance(saved.get("shards"), list):
            raise ValueError(f"{path} is not a shard build's progress (a JSON object with header and shards)")
        if saved.get("header") != header:
            return []  # another build's: start clean
        for i, shard in enumerate(saved["shards"]):
            check_fields(path, f"shards[{i}].", shard, {**SHARD_FIELDS, "n_input_docs": int})
            name = f"shard_{i:05d}"
            if (shard["file"], shard["index"]) != (f"{name}.bin", f"{name}.idx.npy"):
                raise ValueError(f"{path}: shards[{i}] names {shard['file']}, {shard['index']}, not {name}.*")
            bin_path = out_dir / shard["file"]
            if not bin_path.is_file() or bin_path.stat().st_size != shard["n_tokens"] * dtype.itemsize:
                raise ValueError(f"{bin_path}: missing, or not the size {path} records")
            read_index(out_dir, f"shards[{i}]", shard)
    except (OSError, ValueError) as err:
        log.warning("%s; preparing %s again from the first document", _reason(err), out_dir)
        return []
    return saved["shards"]


# ----------------------------------------------------------------------------- every source of a config
# A source's `sha256` pins the file each split is made from (config.py, InputHashes): another file is refused
# before its shards are built or a finished directory of its shards is used, in one line saying how to get the
# pinned one. The corpus of the reproduction (configs/data/repro30m.yaml) is built, not committed, so a build
# with other package versions or another CPython would otherwise train quietly on other text.
REBUILD_PINNED = (
    "rebuild it with `python scripts/build_corpora.py --corpora` (with the package versions and the CPython "
    "data/README.md names)"
)


def _pin(src, split: str) -> tuple[str, str | None]:
    """(the config key of the split's pin, the sha256 it expects or None)."""
    return f"data.sources.{src.name}.sha256.{split}", getattr(src.sha256, split) if src.sha256 else None


def check_pinned_inputs(src, split: str, files: list[Path], fingerprint: dict) -> None:
    """Refuse the split's input unless it is the one file whose sha256 the source pins (no pin: nothing to
    check). `fingerprint`: inputs_fingerprint of `files`, which holds their sha256 already."""
    pin, expected = _pin(src, split)
    if expected is None:
        return
    if len(files) != 1:
        shown = ", ".join(str(p) for p in files[:3]) + (", ..." if len(files) > 3 else "")
        raise ValueError(
            f"{pin}: pins one file, but data.sources.{src.name}.{split} names {len(files)} ({shown}); "
            f"name one file, or remove {pin}"
        )
    found = fingerprint["files"][0]["sha256"]
    if found != expected:
        raise ValueError(
            f"{files[0]}: sha256 {found[:16]}..., but {pin} expects {expected[:16]}...: not the pinned corpus; "
            f"{REBUILD_PINNED}, or set {pin}=null to train on this file"
        )


def check_pinned_shards(src, split: str, split_dir: Path) -> None:
    """Refuse prepared shards (`shards`, `val_shards`) unless their manifest says they were made from the one
    file whose sha256 the source pins."""
    pin, expected = _pin(src, split)
    if expected is None:
        return
    inputs = read_manifest(split_dir).get("inputs")
    files = inputs.get("files") if isinstance(inputs, dict) else None
    made_from = files[0] if isinstance(files, list) and len(files) == 1 and isinstance(files[0], dict) else {}
    found = made_from.get("sha256")
    if not isinstance(found, str):
        raise ValueError(
            f"{split_dir / MANIFEST}: does not record the one input file {pin} pins (shards made from several "
            f"files, or by another program); prepare them from the pinned file, or remove {pin}"
        )
    if found != expected:
        raise ValueError(
            f"{split_dir / MANIFEST}: made from {made_from.get('name')} with sha256 {found[:16]}..., but {pin} "
            f"expects {expected[:16]}...: not the pinned corpus; {REBUILD_PINNED} and prepare the shards from it "
            f"again, or remove {pin} to train on these shards"
        )


def _digest(inputs) -> str:
    """16 hex digits naming what a split is made from: the sha256 of its one file, or of the whole record."""
    import hashlib

    one_file = isinstance(inputs, dict) and set(inputs) <= {"text_field", "format", "files"}  # not a `datasets` one
    files = inputs.get("files") if one_file else None
    if isinstance(files, list) and len(files) == 1 and isinstance(files[0], dict):
        if isinstance(files[0].get("sha256"), str):
            return files[0]["sha256"][:16]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def corpus_record(data_cfg) -> dict[str, str]:
    """What a run's data is made from, for its record (the reproduction's run.json): "<source>/<split>" -> the
    first 16 hex digits of the sha256 of the split's input file (of several files: of their names and sha256
    together), for the training splits the phases use and every held-out split, as the trainer reads them.
    Raw inputs are hashed (as preparing their shards does); prepared shards give what their manifest records."""
    cfg = data_cfg if isinstance(data_cfg, DataConfig) else parse_data_config(data_cfg)
    used = {name for phase in cfg.phases for name in phase.weights}
    record = {}
    for name, src in cfg.sources.items():
        for split, raw, prepared in (("train", src.train, src.shards), ("val", src.val, src.val_shards)):
            if split == "train" and name not in used:
                continue
            if prepared is not None:
                manifest = read_manifest(resolve_path(prepared))
                record[f"{name}/{split}"] = _digest(manifest.get("inputs") or [s["sha256"] for s in manifest["shards"]])
            elif raw is not None:
                key = f"data.sources.{name}.{split}"
                record[f"{name}/{split}"] = _digest(inputs_fingerprint(raw, src.text_field, src.format, key))
    return record


def _cache_split_dir(cfg: DataConfig, identity: str, source: str, split: str, fingerprint: dict) -> Path:
    """cache_dir/<tokenizer identity>/<source>-<hash of the inputs>/<split>: keyed by what the shards are made
    from (files and their sha256, text field, format, shard size), not by the source's name alone, so two
    data configs with a source of the same name (bundled and corpora both have `literature`) keep both."""
    import hashlib

    made_from = json.dumps({"inputs": fingerprint, "docs_per_shard": cfg.docs_per_shard}, sort_keys=True)
    digest = hashlib.sha256(made_from.encode()).hexdigest()[:12]
    return resolve_path(cfg.cache_dir, cache=True) / identity.replace(":", "-") / f"{source}-{digest}" / split


def prepare_all(
    data_cfg,
    *,
    num_proc: int | None = None,
    progress: bool | None = None,
    splits=("train", "val"),
    names=None,
    cached_only: bool = False,
) -> dict:
    """Make sure every configured source split has token shards; return {"name/split": dir}.
    Raw sources are tokenized into cache_dir/<tokenizer identity>/<source>-<inputs hash>/<split> (other
    inputs get another directory); `shards:` sources are used as given and only checked when opened.
    cached_only: tokenize nothing; a raw split whose shards are not in the cache, current, is left out."""
    cfg = data_cfg if isinstance(data_cfg, DataConfig) else parse_data_config(data_cfg)
    tok = load_tokenizer(cfg.tokenizer)
    dirs = {}
    for name, src in cfg.sources.items():
        if names is not None and name not in names:
            continue
        for split in splits:
            raw, prepared = (src.train, src.shards) if split == "train" else (src.val, src.val_shards)
            if prepared is not None:
                check_pinned_shards(src, split, resolve_path(prepared))
                dirs[f"{name}/{split}"] = resolve_path(prepared)
            elif raw is not None:
                key = f"data.sources.{name}.{split}"
                fingerprint = inputs_fingerprint(raw, src.text_field, src.format, key)
                if _pin(src, split)[1] is not None:  # before anything is written (a `datasets` input has no pin)
                    check_pinned_inputs(src, split, expand_inputs(raw, key), fingerprint)
                out = _cache_split_dir(cfg, tok.identity, name, split, fingerprint)
                if cached_only:
                    if _why_not_current(out, tok, fingerprint) is None:
                        dirs[f"{name}/{split}"] = out
                    continue
                try:
                    prepare_split(
                        raw,
                        out,
                        tokenizer=cfg.tokenizer,
                        text_field=src.text_field,
                        fmt=src.format,
                        num_proc=num_proc or cfg.num_proc,
                        docs_per_shard=cfg.docs_per_shard,
                        key=key,
                        progress=progress,
                        fingerprint=fingerprint,
                    )
                except OSError as e:  # the inputs were read above (fingerprint): this is the cache's side
                    raise ValueError(
                        f"data.cache_dir={str(cfg.cache_dir)!r}: cannot write the token shards of {key} "
                        f"there ({why_not_written(e)}); choose a writable directory"
                    ) from None
                dirs[f"{name}/{split}"] = out
    return dirs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m nvfp4train.data.prepare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", nargs="+", help="files, globs or directories of documents")
    parser.add_argument(
        "--hf",
        help="a `datasets` dataset: a hub name (needs a reachable hub), a directory written "
        "by save_to_disk or of data files, or a builder (json, parquet) with --data-files",
    )
    parser.add_argument("--hf-config", default=None)
    parser.add_argument("--data-files", nargs="+", help="with --hf json|parquet|csv|text: the files to load")
    parser.add_argument("--split", default="train")
    parser.add_argument("--out", help="output directory of the shards")
    parser.add_argument("--tokenizer", default="bpe8k")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--format", default=None, choices=["jsonl", "json", "txt", "parquet"])
    parser.add_argument(
        "--num-proc",
        type=int,
        default=max(1, (os.cpu_count() or 1) - 1),
        help="tokenizing threads",
    )
    parser.add_argument("--docs-per-shard", type=int, default=100_000)
    parser.add_argument("--config", help="a data config yaml: prepare every source (train and val) it names")
    args = parser.parse_args(argv)

    def fail(message: str):
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
        sys.exit(2)

    for flag, value in (("--num-proc", args.num_proc), ("--docs-per-shard", args.docs_per_shard)):
        if value < 1:
            fail(f"{flag} {value}: expected an integer >= 1")
    if not args.config and (not args.out or not (args.input or args.hf)):
        fail("give --out and --input (or --hf), or --config (see --help)")
    out = Path(args.out).expanduser().absolute() if args.out else None  # the user's path: from where they are
    if out is not None:
        blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            fail(f"--out {args.out}: {blocker} is a file, not a directory")
    made = [p for p in (out, out.parent / f".{out.name}.lock") if not p.exists()] if out else []

    def remove_what_this_made():  # leave nothing behind of a build that stopped before finishing any shard
        for path in made:
            if path.is_dir() and not (path / PROGRESS).exists():
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_file():
                path.unlink(missing_ok=True)

    stopped_by: list[int] = []

    def on_sigterm(signum, frame):  # stop as on Ctrl-C: the finished shards kept, no temp file left
        stopped_by.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        _main(args)
    except KeyboardInterrupt as e:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below runs to its end
        remove_what_this_made()
        if isinstance(e, PrepareInterrupted) and e.n_shards:
            kept = (
                f"the {e.n_shards} finished shard(s) of {e.out_dir} are kept ({PROGRESS}); "
                "run the same command again to resume after them"
            )
        elif isinstance(e, PrepareInterrupted):
            kept = f"no shard of {e.out_dir} was finished, none is kept; run the same command again to start over"
        else:
            kept = "no shard was being written; run the same command again to prepare the shards"
        print(f"{'terminated (SIGTERM)' if stopped_by else 'interrupted'}: {kept}", file=sys.stderr)
        # 128 + the signal, as a shell reports it, so that `prepare && train` stops here
        sys.exit(128 + (stopped_by[0] if stopped_by else signal.SIGINT))
    except (ValueError, OSError, yaml.YAMLError) as e:
        remove_what_this_made()
        if isinstance(e, OSError) and e.errno is not None:  # the system's words, with the file they are about
            e = f"{e.filename or args.out}: cannot {'read' if e.errno == 2 else 'write'} ({e.strerror})"
        elif isinstance(e, OSError):  # numpy's short write
            e = f"{args.out}: cannot write ({why_not_written(e)})"
        elif isinstance(e, yaml.YAMLError):
            e = f"--config {args.config}: not valid YAML ({str(e).splitlines()[0]})"
        fail(e)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args) -> None:
    if args.config:
        cfg = yaml.safe_load(resolve_path(args.config).read_text())
        if not isinstance(cfg, dict):
            raise ValueError(f"--config {args.config}: not a data config (a YAML mapping with `sources`)")
        for name, split_dir in prepare_all(cfg, num_proc=args.num_proc, progress=True).items():
            print(f"{name}: {split_dir}")
        return
    spec = args.input
    if args.hf:
        spec = {"hf": args.hf, "name": args.hf_config, "split": args.split}
        if args.data_files:
            spec["data_files"] = args.data_files
    manifest = prepare_split(
        spec,
        Path(args.out).expanduser().absolute(),  # as checked in main(): from the user's working directory
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        fmt=args.format,
        num_proc=args.num_proc,
        docs_per_shard=args.docs_per_shard,
        progress=True,
    )
    print(
        f"{args.out}: {manifest['n_docs']} documents, {manifest['n_tokens']} tokens, "
        f"{len(manifest['shards'])} shard(s), tokenizer {manifest['tokenizer']}"
    )


if __name__ == "__main__":
    main()
