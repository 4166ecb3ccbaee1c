"""`python -m nvfp4train.eval`: BF16 evaluation of a checkpoint, lm-eval-style log-likelihood scoring,
and bad input refused in one line with nothing written."""

import json
import math
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from nvfp4train.eval import harness, load_run_model
from tests.conftest import REPO, cli_env, read_metrics, run_train
from tests.eval.conftest import TINY


def run_eval(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.eval", *args],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_eval_writes_heldout_losses_and_task_scores(tiny_run):
    proc = run_eval(f"run_dir={tiny_run}", "max_items=6", "heldout_sequences=2")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    result = json.loads((tiny_run / "eval.json").read_text())
    assert summary["eval_json"] == str(tiny_run / "eval.json") and result["step"] == 4
    # The same held-out windows and weights as the training loop's final evaluation, in BF16: same loss.
    final = read_metrics(tiny_run)[-1]
    assert set(result["heldout"]) == {"literature", "encyclopedic", "code"}
    for source, v in result["heldout"].items():
        assert v["loss"] == pytest.approx(final[f"val/{source}"], abs=2e-3)
        assert v["ppl"] == pytest.approx(math.exp(v["loss"]))
        assert summary[f"heldout/{source}"] == pytest.approx(v["loss"], abs=1e-4)
    definitions = harness.load_task_definitions()
    assert set(result["tasks"]) == set(definitions) and len(definitions) >= 3
    # a progress line on stderr as each part starts (stdout may go to a file: its lines come at the end)
    names = list(result["tasks"])
    assert proc.stderr.splitlines() == [
        "eval: held-out loss (bf16, up to 2 sequences of literature, encyclopedic, code) ...",
        *(f"eval: task {name} ({i}/{len(names)}, 6 items) ..." for i, name in enumerate(names, 1)),
    ], proc.stderr
    for name, v in result["tasks"].items():
        assert v["n"] == 6 and v["kind"] == definitions[name]["kind"]
        value = v[v["primary"]]
        assert (value > 0) if v["kind"] == "loss" else (0 <= value <= 1)


def test_loglikelihood_matches_a_direct_forward_and_ignores_batching(tiny_run):
    model, config, _ = load_run_model(tiny_run)
    g = torch.Generator().manual_seed(0)
    requests = [
        (torch.randint(1, 8192, (n,), generator=g).tolist(), torch.randint(1, 8192, (k,), generator=g).tolist())
        for n, k in [(5, 1), (20, 3), (9, 7), (2, 2)]
    ]
    batched = harness.loglikelihoods(model, requests, max_len=64, batch_size=4)
    single = harness.loglikelihoods(model, requests, max_len=64, batch_size=1)
    for (context, continuation), (score, greedy), (score1, _) in zip(requests, batched, single):
        ids = torch.tensor([context + continuation])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs = torch.log_softmax(model(ids[:, :-1]).float(), -1)[0]
        targets = ids[0, len(context) :]
        direct = logprobs[len(context) - 1 :].gather(-1, targets[:, None]).sum().item()
        assert score == pytest.approx(direct, abs=0.05) and score == pytest.approx(score1, abs=0.05)
        assert score1 == direct  # one request a batch: the same forward, and the value read once at the end
        assert greedy == bool((logprobs[len(context) - 1 :].argmax(-1) == targets).all())


class FavoursToken(torch.nn.Module):
    """Next-token distribution fixed at p(5) = 0.9, the rest uniform: the exact scores are known."""

    def forward(self, ids):
        logits = torch.zeros(*ids.shape, 16)
        logits[..., 5] = math.log(0.9 * 15 / 0.1)
        return logits


class Chars:
    encode = staticmethod(lambda text: [ord(c) - ord("a") for c in text])


def test_multiple_choice_acc_and_acc_norm_follow_lm_eval():
    # "f" is token 5, the favoured one.
    items = [
        {"context": "ab", "choices": ["ff", "f", "fbc"], "gold": 0},
        {"context": "ab", "choices": ["ffffff", "bf", "f"], "gold": 2},
    ]
    # Item 1: acc picks "f" (ln .9 > 2 ln .9: wrong), acc_norm ties "ff" and "f" at ln .9 per byte and
    # takes the first, "ff" (right). Item 2: acc picks "f" (right), acc_norm "ffffff" (wrong).
    scores = harness.score_task(FavoursToken(), Chars, {"kind": "multiple_choice"}, items, 16, 4, "cpu")
    assert scores["acc"] == 0.5 and scores["acc_norm"] == 0.5 and scores["chance"] == pytest.approx(1 / 3)
    cloze = harness.score_task(
        FavoursToken(),
        Chars,
        {"kind": "exact_match"},
        [{"context": "a", "target": "ff"}, {"context": "a", "target": "fa"}],
        16,
        4,
        "cpu",
    )
    assert cloze["exact_match"] == 0.5
    loss = harness.score_task(FavoursToken(), Chars, {"kind": "loss"}, [{"context": "a", "target": "ff"}], 16, 4, "cpu")
    assert loss["loss"] == pytest.approx(-math.log(0.9), rel=1e-4)
    assert loss["bits_per_byte"] == pytest.approx(-2 * math.log2(0.9) / 2, rel=1e-4)


def one_line_error(capsys, *args):
    from nvfp4train.eval.__main__ import main

    assert main(list(args)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_input_is_one_line_and_writes_nothing(tiny_run, tmp_path, capsys):
    proc = run_eval(f"run_dir={tiny_run}", "tasks=nope", check=False)  # the CLI itself: exit 2, one line
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: tasks: unknown task 'nope'; available: all, {', '.join(harness.load_task_definitions())}"
    ]
    assert "step=99: no checkpoint" in one_line_error(capsys, f"run_dir={tiny_run}", "step=99")
    assert "unknown key 'colour'; allowed: run_dir, step" in one_line_error(capsys, f"run_dir={tiny_run}", "colour=red")
    assert "run_dir: required" in one_line_error(capsys)
    empty = tmp_path / "empty"
    shutil.copytree(tiny_run, empty, ignore=shutil.ignore_patterns("checkpoints", "eval.json"))
    assert "no complete checkpoint" in one_line_error(capsys, f"run_dir={empty}")
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other, ignore=shutil.ignore_patterns("eval.json"))
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["model"]["d_model"] = 64
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    assert "written for another model: d_model" in one_line_error(capsys, f"run_dir={other}")
    assert not (empty / "eval.json").exists() and not (other / "eval.json").exists()


@pytest.mark.slow  # a short NVFP4 run and three evaluations
def test_eval_precision_both_adds_the_training_precision_of_the_checkpoints_step(tmp_path, capsys):
    """A run that switches fully to BF16 halfway: step 1's checkpoint is in NVFP4, step 4's in BF16."""
    from nvfp4train.eval.__main__ import main

    run = tmp_path / "run"
    run_train(
        f"out_dir={run}",
        "precision=nvfp4",
        "precision.switch.at_fraction=0.5",
        "train.eval_precision=both",
        "train.eval_every=1",
        "train.save_every=1",
        "train.keep_last=4",
        *TINY,
    )
    in_training = {r["step"]: r for r in read_metrics(run) if "val/mean" in r}
    proc = run_eval(
        f"run_dir={run}", "step=1", "tasks=arithmetic", "max_items=2", "heldout_sequences=2", "eval_precision=both"
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    before = json.loads((run / "eval.json").read_text())
    assert before["eval_precision"] == "both" and before["tasks_precision"] == "bf16"
    assert before["training_precision"] == {
        "name": "nvfp4",
        "backend": "emulated",
        "switched": None,
        "runs_in_bf16": False,
    }
    assert set(before["heldout_tp"]) == set(before["heldout"]) == {"literature", "encyclopedic", "code"}
    for source in before["heldout"]:  # the training loop's numbers of the same weights, in each precision
        assert before["heldout"][source]["loss"] == pytest.approx(in_training[1][f"val/{source}"], abs=2e-3)
        assert before["heldout_tp"][source]["loss"] == pytest.approx(in_training[1][f"val_tp/{source}"], abs=2e-3)
        assert before["heldout_tp"][source]["loss"] != before["heldout"][source]["loss"]
        assert summary[f"heldout_tp/{source}"] == pytest.approx(before["heldout_tp"][source]["loss"], abs=1e-4)
    assert "(bf16)" in proc.stdout and "(nvfp4)" in proc.stdout

    assert (
        main(
            [
                f"run_dir={run}",
                "step=1",
                "tasks=arithmetic",
                "max_items=2",
                "heldout_sequences=2",
                "eval_precision=train",
            ]
        )
        == 0
    )
    train_only = json.loads((run / "eval.json").read_text())
    assert train_only["heldout"] == before["heldout_tp"] and "heldout_tp" not in train_only

    assert (
        main([f"run_dir={run}", "tasks=arithmetic", "max_items=2", "heldout_sequences=2", "eval_precision=both"]) == 0
    )
    after = json.loads((run / "eval.json").read_text())
    assert after["step"] == 4 and after["training_precision"]["switched"] == "full"
    assert after["training_precision"]["runs_in_bf16"] and after["heldout_tp"] == after["heldout"]  # measured once
    assert in_training[4]["val_tp/mean"] == in_training[4]["val/mean"]
    capsys.readouterr()

    # a checkpoint without its trainer state cannot say its precision: one line, nothing written
    (run / "eval.json").unlink()
    (run / "checkpoints" / "step_00000004" / "rank_00000.pt").unlink()
    assert main([f"run_dir={run}", "tasks=arithmetic", "max_items=2", "eval_precision=both"]) == 2
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if not line.startswith("eval: ")]  # eval's progress lines
    assert len(errors) == 1 and errors[0].startswith("error: ") and "rank_00000.pt missing" in errors[0], err
    assert "Traceback" not in err
    assert not (run / "eval.json").exists()


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_eval_json_that_is_a_link_is_refused_before_evaluating(tiny_run, tmp_path, how):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval.json"))
    user_file = tmp_path / "user.json"
    user_file.write_bytes(b'{"mine": true}\n')
    (run / "eval.json").symlink_to(user_file) if how == "symlink" else (run / "eval.json").hardlink_to(user_file)
    proc = run_eval(f"run_dir={run}", "max_items=2", "heldout_sequences=2", check=False)
    what = (
        f"is a symbolic link (to {user_file})"
        if how == "symlink"
        else "has 2 hard links (writing it would change the other names too)"
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {run / 'eval.json'} {what}; a run directory's files must be its own: remove it or choose "
        "another out_dir"
    ], proc.stderr[-3000:]
    assert user_file.read_bytes() == b'{"mine": true}\n'


def test_eval_of_a_read_only_run_directory_is_refused_before_evaluating(tiny_run, tmp_path):
    import os

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval.json"))
    command = [sys.executable, "-m", "nvfp4train.eval", f"run_dir={run}", "max_items=2", "heldout_sequences=2"]
    if os.geteuid() == 0:  # root writes anywhere: drop that capability for the evaluation
        if not shutil.which("capsh"):
            pytest.skip("running as root without capsh to drop CAP_DAC_OVERRIDE")
        command = ["capsh", "--drop=cap_dac_override", "--", "-c", " ".join(map(shlex.quote, command))]
    run.chmod(0o555)
    try:
        proc = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    finally:
        run.chmod(0o755)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {run / 'eval.json'}: cannot be written ({run} is not writable); nothing was evaluated"
    ], proc.stderr[-3000:]
    assert not (run / "eval.json").exists()


def test_config_yaml_that_is_a_fifo_is_not_called_missing(tiny_run, tmp_path, capsys):
    import os

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval.json", "config.yaml"))
    os.mkfifo(run / "config.yaml")
    err = one_line_error(capsys, f"run_dir={run}")
    assert "config.yaml: is a FIFO; a run directory's files must be regular files" in err, err
    assert "not found" not in err, err
