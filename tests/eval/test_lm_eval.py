"""The lm-evaluation-harness adapter, offline: lm-eval's own CLI scores a checkpoint on the shipped task YAMLs
(evals/lm_eval/), its `hf` model on the export gives the same numbers, and the adapter encodes, rolls and
generates as lm-eval's own models do."""

import json
import sys

import pytest
import torch

from nvfp4train.data import load_tokenizer
from nvfp4train.eval import harness, load_run_model
from nvfp4train.export import main as export_main
from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env

pytest.importorskip("lm_eval")


def lm_eval_cli(tmp_path, name: str, model: str, model_args: str, tasks: str, limit: int) -> dict:
    out = tmp_path / name
    proc = run_and_kill_on_timeout(
        [
            sys.executable,
            "-m",
            "nvfp4train.eval.lm_eval_adapter",
            "run",
            "--model",
            model,
            "--model_args",
            model_args,
            "--tasks",
            tasks,
            "--include_path",
            "evals/lm_eval",
            "--limit",
            str(limit),
            "--output_path",
            str(out),
        ],
        cwd=REPO,
        env=cli_env(),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(out.rglob("results_*.json")).read_text())["results"]


@pytest.mark.slow
def test_hf_model_on_the_export_and_our_model_on_the_run_agree(tiny_run, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # lm-eval's `hf` model imports it
    export = tmp_path / "export"
    assert export_main([f"run_dir={tiny_run}", f"out={export}"]) == 0
    tasks = "wiki_next_sentence,humaneval_solutions"
    # max_length beyond the run's 32 tokens: lm-eval's hf model refuses continuations longer than it.
    ours = lm_eval_cli(tmp_path, "ours", "nvfp4train", f"run_dir={tiny_run},dtype=float32,max_length=512", tasks, 8)
    theirs = lm_eval_cli(tmp_path, "hf", "hf", f"pretrained={export},dtype=float32,max_length=512", tasks, 8)
    mc_ours, mc_hf = ours["wiki_next_sentence"], theirs["wiki_next_sentence"]
    assert mc_ours["acc,none"] == mc_hf["acc,none"] and mc_ours["acc_norm,none"] == mc_hf["acc_norm,none"]
    bpb_ours = ours["humaneval_solutions"]["bits_per_byte,none"]
    bpb_hf = theirs["humaneval_solutions"]["bits_per_byte,none"]
    assert bpb_ours == pytest.approx(bpb_hf, rel=1e-5), (bpb_ours, bpb_hf)


def test_shipped_task_yaml_scores_like_our_harness(tiny_run, tmp_path):
    """The lm-eval YAML of a task of evals/tasks.yaml and `python -m nvfp4train.eval`'s harness agree (BF16)."""
    results = lm_eval_cli(tmp_path, "yaml", "nvfp4train", f"run_dir={tiny_run}", "humaneval_solutions", 8)
    model, config, _ = load_run_model(tiny_run)
    items = harness.read_items({"data": "tasks/humaneval_solutions.jsonl"})[:8]
    ours = harness.score_task(
        model,
        load_tokenizer(config["data"]["tokenizer"]),
        {"kind": "loss"},
        items,
        config["train"]["seq_len"],
        16,
        "cpu",
    )
    assert results["humaneval_solutions"]["bits_per_byte,none"] == pytest.approx(ours["bits_per_byte"], rel=2e-3)


def test_registration_leaves_lm_evals_own_models_usable():
    code = (
        "import nvfp4train.eval.lm_eval_adapter\nfrom lm_eval.api.registry import get_model\n"
        "print(get_model('nvfp4train').__name__, get_model('dummy').__name__)"
    )
    proc = run_and_kill_on_timeout([sys.executable, "-c", code], cwd=REPO, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["NVFP4TrainLM", "DummyLM"]


def test_encode_pair_splits_the_whole_encoding_like_lm_eval(tiny_run):
    from nvfp4train.eval.lm_eval_adapter import NVFP4TrainLM

    lm = NVFP4TrainLM(run_dir=str(tiny_run), device="cpu")
    tok = lm.nvfp4_tokenizer
    context, continuation = lm._encode_pair("The cat", "s sat")
    whole = tok.encode("The cats sat")
    assert context == tok.encode("The cat") and continuation == whole[len(context) :]
    assert continuation != tok.encode("s sat")  # what encoding the two parts separately would have scored
    answer = tok.encode("Answer:")
    assert lm._encode_pair("Answer: ", "12") == (answer, tok.encode("Answer: 12")[len(answer) :])


def test_rolling_loglikelihood_and_greedy_generation(tiny_run):
    from lm_eval.api.instance import Instance

    from nvfp4train.eval.lm_eval_adapter import NVFP4TrainLM

    lm = NVFP4TrainLM(run_dir=str(tiny_run), device="cuda")  # falls back to the CPU here
    tok = lm.nvfp4_tokenizer
    text = "The quick brown fox jumps over the lazy dog. " * 4  # longer than one 32-token window
    tokens = tok.encode(text)
    assert len(tokens) > lm.max_length
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    # Each token once: the windowed sum is close to one pass with all context (BF16, shorter contexts).
    one_pass, _ = harness.loglikelihoods(lm.model, [([tok.eos_id], tokens)], max_len=len(tokens) + 1)[0]
    assert rolling < 0 and rolling == pytest.approx(one_pass, rel=0.05)
    out = lm.generate_until([Instance("generate_until", {}, ("The quick", {"until": ["\n"], "max_gen_toks": 6}), 0)])
    assert isinstance(out[0], str) and "\n" not in out[0]
    lm32 = NVFP4TrainLM(run_dir=str(tiny_run), device="cpu", dtype="float32")
    ids = tok.encode("The quick")
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(lm32.model(torch.tensor([ids]))[0, -1].argmax()))
    expected = tok.decode(ids[len(tok.encode("The quick")) :])
    got = lm32.generate_until([Instance("generate_until", {}, ("The quick", {"until": [], "max_gen_toks": 6}), 0)])
    if tok.eos_id not in ids:
        assert got == [expected]


def test_bad_model_args_give_one_line(tiny_run, tmp_path):
    proc = run_and_kill_on_timeout(
        [
            sys.executable,
            "-m",
            "nvfp4train.eval.lm_eval_adapter",
            "run",
            "--model",
            "nvfp4train",
            "--model_args",
            f"run_dir={tiny_run},dtype=fp8",
            "--tasks",
            "humaneval_solutions",
            "--include_path",
            "evals/lm_eval",
            "--limit",
            "1",
            "--output_path",
            str(tmp_path / "o"),
        ],
        cwd=REPO,
        env=cli_env(),
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: dtype='fp8': allowed: bfloat16, float32"
