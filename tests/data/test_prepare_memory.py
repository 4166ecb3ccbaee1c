"""Preparing data with one giant document: memory stays bounded (the document is encoded in pieces) and
the tokens are exactly those of encoding it whole."""

import json
import random
import subprocess
import sys

import numpy as np

from nvfp4train.data.prepare import encode_documents, split_document
from nvfp4train.data.tokenizer import load_tokenizer
from tests.conftest import REPO, cli_env

WORDS = ["alpha", "Beta", "γάμμα", "42", "3.14", "x=y;", "naïve", "日本語", "don't", "it's", "--", "\u00a0", "🙂"]
GAPS = [" ", " ", "  ", "\n", "\n\n", "\t", "\n \n", " \n", "\r\n", "   \n\n  "]


def _text(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts, size = [], 0
    while size < n_chars:
        word = rng.choice(WORDS) + rng.choice(GAPS)
        parts.append(word)
        size += len(word)
    return "".join(parts)


def test_pieces_are_short_and_tokenize_exactly_as_the_whole_document():
    tok = load_tokenizer("bpe8k")
    text = _text(60_000, seed=1)
    pieces = split_document(text, piece_chars=300)
    assert "".join(pieces) == text and len(pieces) > 150 and max(map(len, pieces)) <= 300
    whole = np.asarray(tok.encode(text))
    assert np.array_equal(encode_documents(tok, [text], piece_chars=300)[0], whole)
    # a document with no whitespace at all is cut at the piece length: same text, every piece bounded
    blob = "ab" * 1000
    assert "".join(split_document(blob, 300)) == blob and max(map(len, split_document(blob, 300))) == 300


PREPARE = """
import resource, sys
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from nvfp4train.data.prepare import prepare_split
m = prepare_split([sys.argv[1]], sys.argv[2], tokenizer="bpe8k", num_proc=1, progress=False)
# this process's own peak since its exec (ru_maxrss would keep the forking test worker's size across the exec)
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(m["n_tokens"], peak_kib)
"""


def test_a_giant_document_is_prepared_under_a_memory_limit(tmp_path):
    """A 4 MB document: encoding it whole peaks near 2 GB of address space (1.3 GB resident); in pieces
    it stays under 0.9 GB, so a 1.25 GiB limit tells the two apart."""
    doc = tmp_path / "giant.txt"
    doc.write_text(_text(4_000_000, seed=2))
    limit = int(1.25 * 2**30)
    # one tokenizer thread and two malloc arenas: the address space then reflects the data, not the core count
    env = cli_env(RAYON_NUM_THREADS=1, MALLOC_ARENA_MAX=2, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-c", PREPARE, str(doc), str(tmp_path / "out"), str(limit)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    n_tokens, max_rss_kib = map(int, proc.stdout.split()[-2:])
    assert manifest["n_docs"] == 1 and manifest["n_tokens"] == n_tokens > 1_000_000
    # The child's own peak (RUSAGE_CHILDREN would be the largest of every child this test process has waited
    # for, other tests' training runs included; RUSAGE_SELF's ru_maxrss the forking worker's size: both depend
    # on what ran before in the worker).
    assert max_rss_kib < limit // 1024
