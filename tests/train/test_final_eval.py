"""train.final_eval: the final checkpoint evaluated by the training process, the same eval.json as
`python -m nvfp4train.eval` (CPU, one thread, so both processes compute with the same thread count); its
options refused before training starts; a finished run started again evaluates only where eval.json is
missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env

RUN = [
    "precision=nvfp4",
    "train.max_steps=6",
    "train.log_every=3",
    "train.eval_sequences=2",
    "train.progress=false",
]
FINAL = [
    "train.final_eval.enabled=true",
    "train.final_eval.eval_precision=both",
    "train.final_eval.heldout_sequences=4",
    "train.final_eval.tasks=[arithmetic,code_next_line]",
    "train.final_eval.max_items=4",
]
EVAL = ["eval_precision=both", "heldout_sequences=4", "tasks=arithmetic,code_next_line", "max_items=4"]


def command(module: str, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )


def without_time(path) -> dict:
    result = json.loads(path.read_text())
    result.pop("seconds")
    return result


def test_the_training_process_writes_the_eval_commands_eval_json_and_a_rerun_evaluates_only_what_is_missing(
    tmp_path,
):
    out = tmp_path / "run"
    trained = command("nvfp4train.train", *RUN, *FINAL, f"out_dir={out}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "in this process (train.final_eval)" in trained.stderr
    assert json.loads(trained.stdout.strip().splitlines()[-1])["step"] == 6  # eval's summary line, last
    in_training = without_time(out / "eval.json")
    assert in_training["step"] == 6 and in_training["eval_precision"] == "both" and "heldout_tp" in in_training
    assert set(in_training["tasks"]) == {"arithmetic", "code_next_line"}

    written = (out / "eval.json").stat().st_mtime_ns
    again = command("nvfp4train.train", *RUN, *FINAL, f"out_dir={out}")
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr[-2000:]
    assert (out / "eval.json").stat().st_mtime_ns == written  # this evaluation is there: not made again

    (out / "eval.json").unlink()
    again = command("nvfp4train.train", *RUN, *FINAL, f"out_dir={out}")
    assert again.returncode == 0 and without_time(out / "eval.json") == in_training, again.stderr[-2000:]

    separate = command("nvfp4train.eval", f"run_dir={out}", *EVAL)
    assert separate.returncode == 0, separate.stderr[-2000:]
    assert without_time(out / "eval.json") == in_training  # bit for bit the eval command's


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["train.final_eval.tasks=nope"], {}, "train.final_eval.tasks: unknown task 'nope'; available: all, "),
        (
            ["train.final_eval.eval_precision=fp4"],
            {},
            "train.final_eval.eval_precision='fp4': allowed train, bf16, both",
        ),
        (["train.final_eval.step=3"], {}, "unknown key 'step' (train.final_eval.step); allowed: enabled, tasks"),
        ([], {"WORLD_SIZE": "2"}, "the final evaluation runs in a run of one process, this one has 2 ranks"),
    ],
)
def test_bad_final_eval_options_are_one_line_before_anything_is_written(tmp_path, args, env, message):
    out = tmp_path / "run"
    refused = command("nvfp4train.train", *RUN, "train.final_eval.enabled=true", *args, f"out_dir={out}", **env)
    assert refused.returncode == 2, refused.stderr[-2000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in refused.stderr, refused.stderr
    assert not out.exists()


def test_the_final_evaluations_options_are_evals_with_its_defaults():
    import dataclasses

    from nvfp4train.config.commands import EvalConfig
    from nvfp4train.config.run import FinalEvalConfig

    evals = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
    own = {f.name: f.default for f in dataclasses.fields(FinalEvalConfig) if f.name != "enabled"}
    assert own and all(evals[name] == default for name, default in own.items()), (own, evals)
