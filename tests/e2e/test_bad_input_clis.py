"""Malformed input to the command-line tools (compare, data.prepare, summary): a non-zero exit, one line
on stderr (no traceback) and nothing created. Each case builds its inputs in a fresh directory and
checks that the directory holds exactly the same files afterwards."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env

RUN = REPO / "docs" / "results" / "runs" / "fp8_vs_nvfp4" / "bf16" / "seed1"  # a real run's config and metrics


def _run_dir(tmp, name="run"):
    dst = tmp / name
    shutil.copytree(RUN, dst)
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


def _no_model(tmp):
    run = _run_dir(tmp)
    (run / "config.yaml").write_text("train: {max_steps: 3}\n")
    return compare(run, "--out", tmp / "cmp")


def _no_metrics(tmp):
    run = _run_dir(tmp)
    (run / "metrics.jsonl").unlink()
    return compare(run, "--out", tmp / "cmp")


def _no_loss(tmp):
    run = _run_dir(tmp)
    (run / "metrics.jsonl").write_text('{"step": 1, "tokens": 8}\n{"step": 2, "loss": "low"}\n')
    return compare(run, "--out", tmp / "cmp")


def _binary_config(tmp):
    run = _run_dir(tmp)
    (run / "config.yaml").write_bytes(b"\xff\xfe\x00model")
    return compare(run, "--out", tmp / "cmp")


def _bad_eval(tmp):
    run = _run_dir(tmp)
    (run / "eval.json").write_text(json.dumps({"tasks": {"hellaswag": {"primary": "acc"}}}))
    return compare(run, "--out", tmp / "cmp")


def _eval_not_json(tmp):
    run = _run_dir(tmp)
    (run / "eval.json").write_text("{not json")
    return compare(run, "--out", tmp / "cmp")


def _out_is_a_file(tmp):
    run = _run_dir(tmp)
    (tmp / "taken").write_text("x")
    return compare(run, "--out", tmp / "taken", "--no-plots")


def _out_below_a_file(tmp):
    run = _run_dir(tmp)
    (tmp / "taken").write_text("x")
    return compare(run, "--out", tmp / "taken" / "cmp", "--no-plots")


def _no_run_dir(tmp):
    return compare(tmp / "missing", "--out", tmp / "cmp")


def _bad_smooth(tmp):
    return compare(_run_dir(tmp), "--out", tmp / "cmp", "--smooth", "2")


def _prepare_missing_input(tmp):
    return prepare("--input", tmp / "missing.jsonl", "--out", tmp / "shards")


def _prepare_not_an_object(tmp):
    (tmp / "docs.jsonl").write_text('{"text": "fine"}\n[1, 2]\n')
    return prepare("--input", tmp / "docs.jsonl", "--out", tmp / "shards")


def _prepare_not_utf8(tmp):
    (tmp / "docs.jsonl").write_bytes(b'{"text": "fine"}\n\xff\xfe\n')
    return prepare("--input", tmp / "docs.jsonl", "--out", tmp / "shards")


def _prepare_out_below_a_file(tmp):
    (tmp / "docs.jsonl").write_text('{"text": "fine"}\n')
    (tmp / "taken").write_text("x")
    return prepare("--input", tmp / "docs.jsonl", "--out", tmp / "taken" / "shards")


def _prepare_unknown_tokenizer(tmp):
    (tmp / "docs.jsonl").write_text('{"text": "fine"}\n')
    return prepare("--input", tmp / "docs.jsonl", "--out", tmp / "shards", "--tokenizer", tmp / "nope.json")


def _prepare_zero_docs_per_shard(tmp):
    (tmp / "docs.jsonl").write_text('{"text": "fine"}\n')
    return prepare("--input", tmp / "docs.jsonl", "--out", tmp / "shards", "--docs-per-shard", "0")


def _prepare_config_missing(tmp):
    return prepare("--config", tmp / "nope.yaml")


def _prepare_config_not_yaml(tmp):
    (tmp / "data.yaml").write_text("sources: [\n")
    return prepare("--config", tmp / "data.yaml")


def _prepare_config_a_list(tmp):
    (tmp / "data.yaml").write_text("- bundled\n")
    return prepare("--config", tmp / "data.yaml")


def _prepare_config_missing_keys(tmp):
    (tmp / "data.yaml").write_text("sources: {web: {weight: 1}}\n")
    return prepare("--config", tmp / "data.yaml")


def _summary_unknown_preset(tmp):
    return summary("model=nope")


def _summary_bad_seq_len(tmp):
    return summary("seq_len=abc")


def _summary_not_yaml(tmp):
    return summary("model.d_model=[1")


def _summary_unknown_key(tmp):
    return summary("model.nokey=3")


CASES = [_no_model, _no_metrics, _no_loss, _binary_config, _bad_eval, _eval_not_json, _out_is_a_file,
         _out_below_a_file, _no_run_dir, _bad_smooth,
         _prepare_missing_input, _prepare_not_an_object, _prepare_not_utf8, _prepare_out_below_a_file,
         _prepare_unknown_tokenizer, _prepare_zero_docs_per_shard, _prepare_config_missing,
         _prepare_config_not_yaml, _prepare_config_a_list, _prepare_config_missing_keys,
         _summary_unknown_preset, _summary_bad_seq_len, _summary_not_yaml, _summary_unknown_key]


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
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
    proc = subprocess.run(compare(run, "--out", tmp_path / "cmp", "--no-plots"), cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
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


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["eval", "export"])
def test_planted_pickle_shard_is_one_line_and_never_runs(tmp_path, tool):
    import pickle
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "nvfp4train.train", "train.max_steps=1", f"out_dir={run}",
                    "train.eval_sequences=0"], cwd=tmp_path, env=cli_env(), capture_output=True, check=True,
                   timeout=600)
    marker = tmp_path / "PLANTED_CODE_RAN"
    shard = next((run / "checkpoints").glob("step_*/model_optim/*.distcp"))
    shard.write_bytes(pickle.dumps(_PlantedPickle(marker)))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", f"nvfp4train.{tool}", f"run_dir={run}"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "refused" in proc.stderr, proc.stderr
    assert "weights_only" not in proc.stderr + proc.stdout
    assert not marker.exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
