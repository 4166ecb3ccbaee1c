"""Reading raw documents for prepare: local .jsonl/.jsonl.gz/.json (one JSON object per line, text in
`text_field`), .txt/.txt.gz (one document per file), .parquet, a directory or glob of those, or a `datasets`
dataset ({hf: ..., name: config, split: train, data_files: ...}); and the fingerprint of the inputs (sizes and
sha256) that decides whether a finished shard directory is still current."""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import zlib
from pathlib import Path

from .paths import resolve_path, searched_paths
from .shards import sha256_file

KNOWN_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".txt", ".txt.gz", ".parquet")


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt:
        return fmt
    name = path.name.lower()
    for suffix, kind in (
        (".jsonl", "jsonl"),
        (".jsonl.gz", "jsonl"),
        (".json", "jsonl"),
        (".json.gz", "jsonl"),
        (".txt", "txt"),
        (".txt.gz", "txt"),
        (".parquet", "parquet"),
    ):
        if name.endswith(suffix):
            return kind
    raise ValueError(f"cannot tell the format of {path}; use one of {KNOWN_SUFFIXES} or set `format`")


def expand_inputs(spec, key: str = "input") -> list[Path]:
    """A path, glob, directory, or list of them -> sorted list of existing files."""
    items = spec if isinstance(spec, (list, tuple)) else [spec]
    files = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise ValueError(f"{key}: expected a path, glob or list of paths, got {item!r}")
        path = resolve_path(item)
        if any(ch in str(item) for ch in "*?["):
            matched = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not matched:
                raise FileNotFoundError(f"{key}: no files match {path}")
            files.extend(matched)
        elif path.is_dir():
            matched = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(KNOWN_SUFFIXES))
            if not matched:
                raise FileNotFoundError(f"{key}: directory {path} has no {'/'.join(KNOWN_SUFFIXES)} files")
            files.extend(matched)
        elif path.is_file():
            files.append(path)
        else:
            built = Path(item).parts[:2] == ("data", "corpora")  # configs/data/corpora.yaml's, not committed
            how = "; build the corpora first: python scripts/build_corpora.py --corpora" if built else ""
            raise FileNotFoundError(f"{key}: input file not found: {' nor '.join(map(str, searched_paths(item)))}{how}")
    return files


# ----------------------------------------------------------------------------- `datasets` inputs
# {hf: ..., name: ..., split: ..., data_files: ...} goes through the `datasets` library:
#   hf: a hub dataset name (where a hub is reachable), a directory written by `save_to_disk`, a local
#       directory of data files, or a packaged builder (json, parquet, csv, text) with `data_files`.
HF_KEYS = ("hf", "name", "split", "data_files")


def _hf_local_inputs(spec: dict, key: str) -> tuple[Path | None, list[Path]]:
    """The local directory `hf` names (None for a hub name or a builder) and the data_files, resolved."""
    unknown = sorted(set(spec) - set(HF_KEYS))
    if "hf" not in spec or unknown:
        raise ValueError(
            f"{key}: a mapping input is a `datasets` dataset with keys {', '.join(HF_KEYS)} "
            f"(hf required){f'; unknown: {unknown}' if unknown else ''}"
        )
    if not isinstance(spec["hf"], str) or not spec["hf"]:
        raise ValueError(f"{key}.hf: expected a dataset name or directory, got {spec['hf']!r}")
    local = resolve_path(spec["hf"])
    data_files = expand_inputs(spec["data_files"], f"{key}.data_files") if spec.get("data_files") else []
    return (local if local.is_dir() else None), data_files


def _needs(module: str, key: str, what: str):
    """Import an optional dependency (the `hf` extra), or one line saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{key}: {what} needs the `datasets` package: pip install 'nvfp4train[datasets]'") from None


def _iter_hf_documents(spec: dict, text_field: str, key: str):
    datasets = _needs("datasets", key, "a {hf: ...} input")  # slow to import, and only these inputs need it

    local_dir, data_files = _hf_local_inputs(spec, key)
    split = spec.get("split", "train")
    if local_dir is not None and any((local_dir / f).is_file() for f in ("state.json", "dataset_dict.json")):
        ds = datasets.load_from_disk(str(local_dir))  # written by Dataset(Dict).save_to_disk
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{key}.split={split!r}: {local_dir} has splits {', '.join(ds)}")
            ds = ds[split]
    else:
        try:
            ds = datasets.load_dataset(
                str(local_dir or spec["hf"]),
                spec.get("name"),
                split=split,
                streaming=True,
                data_files={split: [str(p) for p in data_files]} if data_files else None,
            )
        except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetsError) as e:
            raise ValueError(
                f"{key}.hf={spec['hf']!r}: not a local directory, and `datasets` cannot load it "
                f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
            ) from None
    where = f"{key} ({local_dir or spec['hf']})"
    if ds.column_names is not None and text_field not in ds.column_names:
        raise ValueError(f"{where}: no {text_field!r} column (columns: {', '.join(ds.column_names)}); set text_field")
    for i, row in enumerate(ds.select_columns([text_field])):
        text = row[text_field]
        if not isinstance(text, str):
            raise ValueError(f"{where}: row {i}: field {text_field!r} is not a string")
        yield text


def iter_documents(spec, *, text_field: str = "text", fmt: str | None = None, key: str = "input"):
    """Yield document texts in a fixed order."""
    if isinstance(spec, dict):
        yield from _iter_hf_documents(spec, text_field, key)
        return
    for path in expand_inputs(spec, key):
        try:
            yield from _iter_file(path, _format_of(path, fmt), text_field, key)
        except (OSError, EOFError, UnicodeDecodeError, zlib.error) as err:  # garbage, truncated, not UTF-8
            why = " ".join(str(err).split()) or type(err).__name__
            raise ValueError(
                f"{path}: unreadable ({why}); {key} must name readable UTF-8 "
                f"{'files compressed with gzip' if path.name.endswith('.gz') else 'files'}"
            ) from None


def _no_field(row, text_field: str, key: str) -> str:
    """`no 'text' field (its fields: id, body); set data.sources.web.text_field=body`: the key to set, named as
    the input was (a data source's key, or prepare's --text-field), with the record's likeliest text field."""
    if not isinstance(row, dict):
        return f"not a JSON object with a {text_field!r} field"
    strings = [k for k, v in row.items() if isinstance(v, str)]
    guess = max(strings, key=lambda k: len(row[k]), default="FIELD")  # the longest string: the document
    m = re.match(r"(data\.sources\.[^.]+)\.", key)
    setting = f"{m.group(1)}.text_field={guess}" if m else f"--text-field {guess}"
    return f"no {text_field!r} field (its fields: {', '.join(map(str, row)) or 'none'}); set {setting}"


def _iter_file(path: Path, kind: str, text_field: str, key: str):
    """The documents of one input file, in file order."""
    opener = gzip.open if path.name.endswith(".gz") else open
    if kind == "txt":
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            yield f.read()
    elif kind in ("jsonl", "json"):
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    text = row[text_field]
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_no}: not a JSON line ({err})") from None
                except (KeyError, TypeError):
                    raise ValueError(f"{path}:{line_no}: {_no_field(row, text_field, key)}") from None
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{line_no}: field {text_field!r} is not a string")
                yield text
    elif kind == "parquet":
        yield from _parquet_texts(path, text_field, key)


def _parquet_texts(path: Path, text_field: str, key: str):
    """The `text_field` column of a parquet file, which must hold strings and no nulls: anything else
    (numbers, lists, a missing value) would otherwise reach the tokenizer as a traceback."""
    pq = _needs("pyarrow.parquet", key, f"parquet input {path}")
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
        if text_field not in schema.names:
            raise ValueError(f"{path}: no {text_field!r} column (columns: {', '.join(schema.names)}); set text_field")
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ValueError(f"{path}: column {text_field!r} holds {kind}, not strings; {key} needs text there")
        row = 0
        for batch in parquet.iter_batches(columns=[text_field]):
            texts = batch.column(0).to_pylist()
            if batch.column(0).null_count:
                raise ValueError(
                    f"{path}: column {text_field!r} has no value (null) in row {row + texts.index(None)}; "
                    f"{key} needs text in every row"
                )
            row += len(texts)
            yield from texts
    except pa.ArrowException as err:  # not parquet, truncated, a damaged page
        why = " ".join(str(err).split())[:200] or type(err).__name__
        raise ValueError(f"{path}: unreadable ({why}); {key} must name readable parquet files") from None


def _describe_files(files: list[Path], root: Path | None = None) -> list[dict]:
    return [
        {"name": str(p.relative_to(root)) if root else p.name, "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in files
    ]


def inputs_fingerprint(spec, text_field: str, fmt: str | None, key: str) -> dict:
    if isinstance(spec, dict):
        local_dir, data_files = _hf_local_inputs(spec, key)
        fingerprint = {"hub": spec, "text_field": text_field}
        if local_dir is not None:  # local data: rebuild when its files change, as for files given directly
            fingerprint["files"] = _describe_files(sorted(p for p in local_dir.rglob("*") if p.is_file()), local_dir)
        if data_files:
            fingerprint["data_files"] = _describe_files(data_files)
        return fingerprint
    return {"text_field": text_field, "format": fmt, "files": _describe_files(expand_inputs(spec, key))}
