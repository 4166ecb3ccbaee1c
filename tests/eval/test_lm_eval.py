"""The lm-evaluation-harness adapter, offline: lm-eval's own CLI scores a checkpoint on a task defined on
local files and agrees with nvfp4train's harness on the same items."""
import json
import subprocess
import sys

import pytest

from nvfp4train.eval import harness, load_run_model
from nvfp4train.data import load_tokenizer
from tests.conftest import REPO, cli_env

pytest.importorskip("lm_eval")

TASK = """task: nvfp4train_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def test_lm_eval_cli_scores_a_local_task_like_our_harness(tiny_run, tmp_path):
    items = harness.read_items({"data": "tasks/wiki_next_sentence.jsonl"})[:8]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local.yaml").write_text(TASK.format(items=tmp_path / "items.jsonl"))
    proc = subprocess.run([sys.executable, "-m", "nvfp4train.eval.lm_eval_adapter", "run", "--model", "nvfp4train",
                           "--model_args", f"run_dir={tiny_run}", "--tasks", "nvfp4train_local_mc",
                           "--include_path", str(tmp_path / "tasks"), "--output_path", str(tmp_path / "out")],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]["nvfp4train_local_mc"]
    model, config, _ = load_run_model(tiny_run)
    ours = harness.score_task(model, load_tokenizer(config["data"]["tokenizer"]), {"kind": "multiple_choice"}, items,
                              config["train"]["seq_len"], 16, "cpu")
    assert results["acc,none"] == pytest.approx(ours["acc"]) and results["acc_norm,none"] == pytest.approx(ours["acc_norm"])


def test_rolling_loglikelihood_and_greedy_generation(tiny_run):
    from lm_eval.api.instance import Instance

    from nvfp4train.eval.lm_eval_adapter import NVFP4TrainLM

    lm = NVFP4TrainLM(run_dir=str(tiny_run), device="cuda")  # falls back to the CPU here
    text = "The quick brown fox jumps over the lazy dog. " * 4  # longer than one 32-token window
    tokens = lm.tokenizer.encode(text)
    assert len(tokens) > lm.max_length
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    # Each token once: the windowed sum is close to one pass with all context (BF16, shorter contexts).
    one_pass, _ = harness.loglikelihoods(lm.model, [([lm.tokenizer.eos_id], tokens)], max_len=len(tokens) + 1)[0]
    assert rolling < 0 and rolling == pytest.approx(one_pass, rel=0.05)
    out = lm.generate_until([Instance("generate_until", {}, ("The quick", {"until": ["\n"], "max_gen_toks": 4}), 0)])
    assert isinstance(out[0], str) and "\n" not in out[0]
