"""`reproduce report` and `reproduce status` read a run through one reader (nvfp4train/runs.py) and one rule
for "done": on committed results (metrics.jsonl.gz) they agree, and a tampered run.json, eval.json or
metrics file is one line naming the file and field in both, never a traceback or a silent skip."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pytest

from nvfp4train.reproduce.__main__ import main
from tests.conftest import REPO, cli_env

RECORD = REPO / "docs" / "results" / "runs" / "fp8_vs_nvfp4" / "nvfp4" / "seed1"
KEY = "fp8_vs_nvfp4/nvfp4/seed1"


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(RECORD, root / KEY)
    return root


def edit_json(path, change):
    value = json.loads(path.read_text())
    value = change(value)
    path.write_text(json.dumps(value))


def status_row(stdout: str) -> list[str]:
    return next(line for line in stdout.splitlines() if line.startswith(KEY)).split()


def test_status_reads_committed_metrics_and_agrees_with_report(results, tmp_path, capsys):
    assert main(["status", "fp8_vs_nvfp4", "--runs-dir", str(results), "--all"]) == 0
    out = capsys.readouterr().out
    run, state, step, tokens, loss, speed = status_row(out)
    records = [json.loads(line) for line in gzip.open(results / KEY / "metrics.jsonl.gz", "rt")]
    last = [r for r in records if r.get("loss") is not None][-1]
    assert state == "done" and step == f"{last['step']}/{last['step']}" and loss == f"{last['loss']:.3f}"
    pending = next(line for line in out.splitlines() if line.startswith("fp8_vs_nvfp4/bf16/seed1")).split()
    assert pending[1:] == ["pending", "0/300", "0", "-", "-"], pending  # no loss: "-", not nan
    assert "1 done, 8 pending" in out
    assert main(["report", "--runs-dir", str(results), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    earlier = (tmp_path / "out" / "reproduction.md").read_text().split("## Earlier runs")[1]
    assert "1 of the" in earlier.split("\n\n")[1]  # the one run status calls done


def no_loss_after_half(run_dir):
    path = run_dir / "metrics.jsonl.gz"
    lines = gzip.open(path, "rt").read().splitlines()
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines[: len(lines) // 2]) + "\n")


TAMPERED = {
    "state of another type": (
        lambda d: edit_json(d / "run.json", lambda v: {**v, "state": 5}),
        "run.json: field 'state' is 5, not done, failed or interrupted",
    ),
    "neither state nor exit code": (
        lambda d: edit_json(d / "run.json", lambda v: {k: x for k, x in v.items() if k not in ("state", "train_rc")}),
        "run.json: has neither `state` nor `train_rc`",
    ),
    "a list for a record": (lambda d: edit_json(d / "run.json", lambda v: [v]), "run.json: holds a list"),
    "NaN seconds": (
        lambda d: edit_json(d / "run.json", lambda v: {**v, "wall_s": float("nan")}),
        "run.json: field 'wall_s' is nan, not a finite number of seconds",
    ),
    "another token budget": (
        lambda d: edit_json(d / "run.json", lambda v: {**v, "tokens": v["tokens"] + 1}),
        "run.json: field 'tokens' is ",
    ),
    "done, metrics stop half-way": (no_loss_after_half, "run.json: says done, but the last training loss in"),
    "NaN mean loss": (
        lambda d: edit_json(d / "eval.json", lambda v: {**v, "heldout_mean_loss": float("nan")}),
        "eval.json: field 'heldout_mean_loss' is nan, not a finite number",
    ),
    "no mean loss": (
        lambda d: edit_json(d / "eval.json", lambda v: {k: x for k, x in v.items() if k != "heldout_mean_loss"}),
        "eval.json: field 'heldout_mean_loss' missing",
    ),
    "another step": (
        lambda d: edit_json(d / "eval.json", lambda v: {**v, "step": 5}),
        "eval.json: field 'step' is 5, but the run ended at step 300",
    ),
    "tasks of another type": (
        lambda d: edit_json(d / "eval.json", lambda v: {**v, "tasks": [1]}),
        "eval.json: field 'tasks' is not a mapping",
    ),
    "not JSON": (lambda d: (d / "eval.json").write_text("{"), "eval.json: not a JSON file"),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_run_is_one_line_in_report_and_status(results, tmp_path, capsys, case):
    tamper, needle = TAMPERED[case]
    tamper(results / KEY)
    assert main(["report", "--runs-dir", str(results), "--out", str(tmp_path / "out"), "--no-figures"]) == 2
    report_err = capsys.readouterr().err.strip().splitlines()
    assert len(report_err) == 1 and report_err[0].startswith("error: ") and needle in report_err[0], report_err
    assert str(results / KEY) in report_err[0]
    assert main(["status", "fp8_vs_nvfp4", "--runs-dir", str(results)]) == 2
    captured = capsys.readouterr()
    state = status_row(captured.out)[1]
    # the same run, the same reader: what report refuses, status does not call done
    assert captured.err.strip().splitlines() == report_err and state in ("damaged", "failed"), (state, captured.err)


def test_report_cli_on_a_tampered_eval_json_exits_2_without_a_traceback(results, tmp_path):
    edit_json(results / KEY / "eval.json", lambda v: {**v, "heldout": {"code": {"loss": "low"}}})
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.reproduce", "report", "--runs-dir", str(results), "--out", str(tmp_path)],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {results / KEY / 'eval.json'}: heldout.code has no finite `loss`; not an evaluation written by "
        "python -m nvfp4train.eval (run it again or remove the file)"
    ]
    assert not (tmp_path / "reproduction.md").exists()
