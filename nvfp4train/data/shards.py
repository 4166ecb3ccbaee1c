"""Memory-mapped token shards: the on-disk format and its reader.

A prepared split is one directory:
    manifest.json            tokenizer identity, dtype, counts, inputs fingerprint, per-shard sha256 of
                             the .bin and of the .idx.npy
    shard_00000.bin          raw little-endian uint16 (vocab <= 65536) or uint32 tokens; every document
                             is stored followed by EOS, so any concatenation has EOS between documents
    shard_00000.idx.npy      int64 document offsets into the .bin (n_docs + 1 entries)
The manifest is written last (atomically): a directory without one is an unfinished build.

What opening a split checks (docs/run-safety.md, "What prepared shards are trusted to contain"): every
manifest field's type; dtype, vocab_size and eos_id against the tokenizer; the totals against the shards;
each .bin's size; each index's sha256 (always: it is small and read whole anyway), its length (n_docs + 1),
that it rises strictly from 0 to n_tokens and that every document it delimits ends in EOS; every token id
below vocab_size; and each .bin's sha256 where data.verify_checksums asks for it. Checksums catch damage and
partial edits; a directory whose every file and checksum was rewritten to agree is trusted like any other.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


# The token dtypes prepare.py writes: token_dtype(vocab_size), nothing else.
TOKEN_DTYPES = ("<u2", "<u4")
# How a user gets sound shards back, said by every refusal of a prepared directory.
PREPARE_AGAIN = "prepare the shards again (a directory under data.cache_dir: delete it, the next run rebuilds it)"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_manifest(split_dir: Path) -> dict:
    path = Path(split_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no token shards at {split_dir}: {path} is missing (prepare them with scripts/prepare_data.py)"
        )
    manifest = read_json(path, "a shard manifest (a JSON object)", PREPARE_AGAIN)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a shard manifest (a JSON object); {PREPARE_AGAIN}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: shard format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}; "
            f"{PREPARE_AGAIN}"
        )
    check_fields(path, "", manifest, MANIFEST_FIELDS)
    for i, shard in enumerate(manifest["shards"]):
        check_fields(path, f"shards[{i}].", shard, SHARD_FIELDS)
        for name in ("file", "index"):
            _check_inside(path, f"shards[{i}].{name}", shard[name])
    vocab_size, dtype = manifest["vocab_size"], manifest["dtype"]
    if vocab_size < 1 or manifest["eos_id"] >= vocab_size:
        raise ValueError(
            f"{path}: field eos_id is {manifest['eos_id']}, vocab_size {vocab_size}: expected "
            f"0 <= eos_id < vocab_size; {PREPARE_AGAIN}"
        )
    if dtype != token_dtype(vocab_size).str:
        raise ValueError(
            f"{path}: field dtype is {dtype!r}, allowed: {TOKEN_DTYPES[0]!r} for vocab_size <= 65536, "
            f"{TOKEN_DTYPES[1]!r} above (vocab_size is {vocab_size}); {PREPARE_AGAIN}"
        )
    for total in ("n_docs", "n_tokens"):
        summed = sum(shard[total] for shard in manifest["shards"])
        if manifest[total] != summed:
            raise ValueError(
                f"{path}: field {total} is {manifest[total]}, but its shards hold {summed}; {PREPARE_AGAIN}"
            )
    return manifest


def read_json(path: Path, what: str, remedy: str):
    """The JSON value in `path`, or one line naming the file, what it should hold and `remedy`: for a file
    that is not UTF-8, not JSON, or nested too deep for the parser (a RecursionError otherwise)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        why = "nested too deep" if isinstance(err, RecursionError) else " ".join(str(err).split())[:200]
        raise ValueError(f"{path} is not {what} ({why}); {remedy}") from None


def _check_inside(path: Path, where: str, name: str) -> None:
    """A manifest names its shard files relative to its own directory, as prepare.py writes them: an
    absolute path, `..` or a link out of the directory would make any file on the machine training data."""
    split_dir = path.parent.resolve()
    target = (split_dir / name).resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts or not target.is_relative_to(split_dir):
        raise ValueError(
            f"{path}: field {where} is {name!r}, which is not a file inside {path.parent}; "
            "a manifest names only its own shard files; prepare the shards again"
        )


# What the reader needs of a manifest (written by prepare.py), and of each of its shards.
MANIFEST_FIELDS = {
    "tokenizer": str,
    "dtype": str,
    "eos_id": int,
    "vocab_size": int,
    "n_docs": int,
    "n_tokens": int,
    "shards": list,
}
SHARD_FIELDS = {"file": str, "index": str, "n_tokens": int, "n_docs": int, "sha256": str, "index_sha256": str}


def check_fields(path: Path, where: str, node, fields: dict) -> None:
    if not isinstance(node, dict):
        raise ValueError(f"{path}: {where.rstrip('.')} is not a JSON object; {PREPARE_AGAIN}")
    for name, kind in fields.items():
        if name not in node:
            raise ValueError(f"{path}: field {where}{name} missing; {PREPARE_AGAIN}")
        value = node[name]
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            expected = {str: "a string", int: "an integer >= 0", list: "a list"}[kind]
            raise ValueError(f"{path}: field {where}{name} is {_short(value)}, expected {expected}; {PREPARE_AGAIN}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_index(split_dir: Path, where: str, shard: dict) -> np.ndarray:
    """The document offsets of one shard (read_manifest's entry `shard`), after checking them against the
    manifest: the file's sha256, then its values (int64, n_docs + 1 of them, strictly rising from 0 to
    n_tokens). A refusal names the file, the manifest field and what is allowed."""
    path = Path(split_dir) / shard["index"]
    manifest = Path(split_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"shard file missing: {path} (listed in {manifest})")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != shard["index_sha256"]:
        raise ValueError(
            f"document index {path}: its sha256 is not {where}.index_sha256 in {manifest} (damaged or edited); "
            f"{PREPARE_AGAIN}"
        )
    try:
        offsets = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:
        raise ValueError(f"unreadable document index {path} ({' '.join(str(err).split())}); {PREPARE_AGAIN}") from None
    n_docs, n_tokens = shard["n_docs"], shard["n_tokens"]
    if offsets.dtype != np.dtype("<i8") or offsets.shape != (n_docs + 1,):
        raise ValueError(
            f"document index {path}: {offsets.dtype.str} offsets of shape {offsets.shape}, but {where}.n_docs "
            f"in {manifest} is {n_docs}: expected {n_docs + 1} '<i8' offsets; {PREPARE_AGAIN}"
        )
    falls = bool(n_docs) and int(np.diff(offsets).min()) < 1
    if offsets[0] != 0 or offsets[-1] != n_tokens or falls:
        raise ValueError(
            f"document index {path}: offsets must rise strictly from 0 to {where}.n_tokens = {n_tokens} "
            f"(they run from {offsets[0]} to {offsets[-1]}{', not always rising' if falls else ''}); {PREPARE_AGAIN}"
        )
    return offsets


class TokenShards:
    """All documents of one prepared split, read through memory maps (nothing is loaded eagerly)."""

    def __init__(self, split_dir, *, expected_tokenizer=None, verify_checksums: bool = False):
        """expected_tokenizer: the configured tokenizer (load_tokenizer's object: its identity, vocab_size
        and eos_id must be the manifest's), or only its identity string; None checks the manifest alone."""
        self.dir = Path(split_dir)
        self.manifest = read_manifest(self.dir)
        manifest_path = self.dir / MANIFEST
        identity = getattr(expected_tokenizer, "identity", expected_tokenizer)
        if identity is not None and self.manifest["tokenizer"] != identity:
            raise ValueError(
                f"token shards at {self.dir} were made with tokenizer {self.manifest['tokenizer']}, "
                f"but the configured tokenizer is {identity}; prepare them again with "
                "this tokenizer or configure the one they were made with"
            )
        for field in ("vocab_size", "eos_id"):  # the same tokenizer file has one vocab size and one EOS
            expected = getattr(expected_tokenizer, field, None)
            if expected is not None and self.manifest[field] != expected:
                raise ValueError(
                    f"{manifest_path}: field {field} is {self.manifest[field]}, but tokenizer {identity} "
                    f"(data.tokenizer) has {field} {expected}; {PREPARE_AGAIN}"
                )
        self.eos_id = int(self.manifest["eos_id"])
        self.vocab_size = int(self.manifest["vocab_size"])
        self.dtype = np.dtype(self.manifest["dtype"])  # one of TOKEN_DTYPES (read_manifest)
        self.tokenizer = self.manifest["tokenizer"]
        self.arrays, starts, lengths, shard_ids = [], [], [], []
        for i, shard in enumerate(self.manifest["shards"]):
            bin_path = self.dir / shard["file"]
            if not bin_path.is_file():
                raise FileNotFoundError(f"shard file missing: {bin_path} (listed in {manifest_path})")
            expected_bytes = shard["n_tokens"] * self.dtype.itemsize
            actual_bytes = bin_path.stat().st_size
            if actual_bytes != expected_bytes:
                raise ValueError(
                    f"truncated or corrupt shard {bin_path}: {actual_bytes} bytes, manifest says "
                    f"{shard['n_tokens']} tokens = {expected_bytes} bytes; {PREPARE_AGAIN}"
                )
            if verify_checksums and sha256_file(bin_path) != shard["sha256"]:
                raise ValueError(f"checksum mismatch for shard {bin_path}; {PREPARE_AGAIN}")
            offsets = read_index(self.dir, f"shards[{i}]", shard)
            tokens = np.memmap(bin_path, dtype=self.dtype, mode="r") if shard["n_tokens"] else np.zeros(0, self.dtype)
            # a shard damaged at the same size (no checksum asked for) must not feed ids past the embedding:
            # one pass over the file, cheap in the page cache (docs/results/code-measurements.md)
            if tokens.size and int(tokens.max()) >= self.vocab_size:
                raise ValueError(
                    f"corrupt shard {bin_path}: token id {int(tokens.max())} >= the tokenizer's vocab "
                    f"size {self.vocab_size} (manifest); {PREPARE_AGAIN}"
                )
            # prepare ends every document with EOS: an index whose documents end elsewhere is not this shard's
            ends = offsets[1:] - 1
            not_eos = np.flatnonzero(tokens[ends] != self.eos_id) if ends.size else ends
            if not_eos.size:
                raise ValueError(
                    f"document index {self.dir / shard['index']} does not match {bin_path}: document "
                    f"{int(not_eos[0])} ends at token {int(ends[not_eos[0]])}, which is not EOS ({self.eos_id}); "
                    f"{PREPARE_AGAIN}"
                )
            self.arrays.append(tokens)
            starts.append(offsets[:-1].astype(np.int64))
            lengths.append(np.diff(offsets).astype(np.int64))
            shard_ids.append(np.full(shard["n_docs"], i, dtype=np.int32))
        self.doc_start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        self.doc_len = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self.doc_shard = np.concatenate(shard_ids) if shard_ids else np.zeros(0, np.int32)
        self.n_docs = int(self.doc_len.size)
        self.n_tokens = int(self.doc_len.sum())
        if self.n_tokens == 0:
            raise ValueError(f"token shards at {self.dir} hold no tokens (empty source)")

    def document(self, i: int) -> np.ndarray:
        s = self.doc_start[i]
        return self.arrays[self.doc_shard[i]][s : s + self.doc_len[i]]

    def fingerprint(self) -> str:
        """Identifies the content (used by loader state to refuse resuming onto different data)."""
        return hashlib.sha256(
            json.dumps([self.tokenizer, [s["sha256"] for s in self.manifest["shards"]]]).encode()
        ).hexdigest()[:16]
