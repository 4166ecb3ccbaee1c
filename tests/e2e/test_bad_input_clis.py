"""Malformed input to the command-line tools (compare, data.prepare, summary): a non-zero exit, one line
on stderr (no traceback) and nothing created. Each case builds its inputs in a fresh directory and
checks that the directory holds exactly the same files afterwards."""

import gzip
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env

RUN = REPO / "docs" / "results" / "runs" / "fp8_vs_nvfp4" / "bf16" / "seed1"  # a real run's config and metrics


def _run_dir(tmp, name="run"):
    """The committed run as the trainer left it: its metrics unpacked to metrics.jsonl."""
    dst = tmp / name
    shutil.copytree(RUN, dst)
    packed = dst / "metrics.jsonl.gz"
    (dst / "metrics.jsonl").write_bytes(gzip.decompress(packed.read_bytes()))
    packed.unlink()
    return dst


def _edit_metrics(run, line_no, edit):
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[line_no] = edit(lines[line_no])
    path.write_text("\n".join(lines) + "\n")


def compare(*args):
    return [sys.executable, "-m", "nvfp4train.compare", *map(str, args)]


def prepare(*args):
    return [sys.executable, "-m", "nvfp4train.data.prepare", *map(str, args)]


def summary(*args):
    return [sys.executable, "-m", "nvfp4train.summary", *map(str, args)]


def _compare_with(name, content):
    """compare on a copy of the real run whose file ``name`` holds ``content`` (None: the file is removed)."""

    def case(tmp):
        run = _run_dir(tmp)
        if content is None:
            (run / name).unlink()
        elif isinstance(content, bytes):
            (run / name).write_bytes(content)
        else:
            (run / name).write_text(content)
        return compare(run, "--out", tmp / "cmp")

    return case


def _compare_out_taken(out):
    """compare with --out at ``out`` (a path under tmp) where tmp/taken is a file."""

    def case(tmp):
        run = _run_dir(tmp)
        (tmp / "taken").write_text("x")
        return compare(run, "--out", tmp / out, "--no-plots")

    return case


def _prepare_docs(docs, *args, out="shards"):
    """data.prepare on tmp/docs.jsonl holding ``docs`` (bytes) into tmp/``out`` (below tmp/taken, a file, where
    ``out`` starts with it), with ``args`` ({tmp}: the directory)."""

    def case(tmp):
        (tmp / "docs.jsonl").write_bytes(docs)
        if out.startswith("taken/"):
            (tmp / "taken").write_text("x")
        return prepare("--input", tmp / "docs.jsonl", "--out", tmp / out, *(a.format(tmp=tmp) for a in args))

    return case


def _prepare_config(text):
    """data.prepare --config tmp/data.yaml holding ``text``."""

    def case(tmp):
        (tmp / "data.yaml").write_text(text)
        return prepare("--config", tmp / "data.yaml")

    return case


GOOD_DOC = b'{"text": "fine"}\n'
CASES = {
    "no_model": _compare_with("config.yaml", "train: {max_steps: 3}\n"),
    "no_metrics": _compare_with("metrics.jsonl", None),
    "no_loss": _compare_with("metrics.jsonl", '{"step": 1, "tokens": 8}\n{"step": 2, "loss": "low"}\n'),
    "binary_config": _compare_with("config.yaml", b"\xff\xfe\x00model"),
    "bad_eval": _compare_with("eval.json", json.dumps({"tasks": {"hellaswag": {"primary": "acc"}}})),
    "eval_not_json": _compare_with("eval.json", "{not json"),
    "out_is_a_file": _compare_out_taken("taken"),
    "out_below_a_file": _compare_out_taken("taken/cmp"),
    "no_run_dir": lambda tmp: compare(tmp / "missing", "--out", tmp / "cmp"),
    "bad_smooth": lambda tmp: compare(_run_dir(tmp), "--out", tmp / "cmp", "--smooth", "2"),
    "prepare_missing_input": lambda tmp: prepare("--input", tmp / "missing.jsonl", "--out", tmp / "shards"),
    "prepare_not_an_object": _prepare_docs(GOOD_DOC + b"[1, 2]\n"),
    "prepare_not_utf8": _prepare_docs(GOOD_DOC + b"\xff\xfe\n"),
    "prepare_out_below_a_file": _prepare_docs(GOOD_DOC, out="taken/shards"),
    "prepare_unknown_tokenizer": _prepare_docs(GOOD_DOC, "--tokenizer", "{tmp}/nope.json"),
    "prepare_zero_docs_per_shard": _prepare_docs(GOOD_DOC, "--docs-per-shard", "0"),
    "prepare_config_missing": lambda tmp: prepare("--config", tmp / "nope.yaml"),
    "prepare_config_not_yaml": _prepare_config("sources: [\n"),
    "prepare_config_a_list": _prepare_config("- bundled\n"),
    "prepare_config_missing_keys": _prepare_config("sources: {web: {weight: 1}}\n"),
    "summary_unknown_preset": lambda tmp: summary("model=nope"),
    "summary_bad_seq_len": lambda tmp: summary("seq_len=abc"),
    "summary_not_yaml": lambda tmp: summary("model.d_model=[1"),
    "summary_unknown_key": lambda tmp: summary("model.nokey=3"),
}


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_malformed_input_is_one_line_and_leaves_nothing(tmp_path, case):
    cmd = case(tmp_path)
    before = _files(tmp_path)
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: "), lines[0]
    assert _files(tmp_path) == before


def test_compare_reports_a_damaged_metrics_line_and_keeps_the_records_after_it(tmp_path):
    run = _run_dir(tmp_path)
    n = len((run / "metrics.jsonl").read_text().splitlines())
    _edit_metrics(run, 4, lambda line: line[:30])
    proc = subprocess.run(
        compare(run, "--out", tmp_path / "cmp", "--no-plots"),
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"1 damaged metrics line(s) skipped: {run / 'metrics.jsonl'}:5" in proc.stderr
    # the curve runs to the end of the run: the records after the damaged line are all there
    curve = json.loads((tmp_path / "cmp" / "compare.json").read_text())["curves"]
    last_tokens = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["tokens"]
    assert n > 10 and max(next(iter(curve.values()))["train_tokens"]) == last_tokens


class _PlantedPickle:
    """A pickle that would create a file if unpickled: loading it must be refused, never run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A run trained for one step, copied by each test that damages it."""
    run = tmp_path_factory.mktemp("one_step") / "run"
    subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "train.max_steps=1", f"out_dir={run}", "train.eval_sequences=0"],
        cwd=run.parent,
        env=cli_env(),
        capture_output=True,
        check=True,
        timeout=600,
    )
    return run


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["eval", "export"])
def test_planted_pickle_shard_is_one_line_and_never_runs(tmp_path, tool, one_step_run):
    import pickle

    run = tmp_path / "run"
    shutil.copytree(one_step_run, run)
    marker = tmp_path / "PLANTED_CODE_RAN"
    shard = next((run / "checkpoints").glob("step_*/model_optim/*.distcp"))
    shard.write_bytes(pickle.dumps(_PlantedPickle(marker)))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = subprocess.run(
        [sys.executable, "-m", f"nvfp4train.{tool}", f"run_dir={run}"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "refused" in proc.stderr, proc.stderr
    assert "weights_only" not in proc.stderr + proc.stdout
    assert not marker.exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
