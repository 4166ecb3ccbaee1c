"""The export loads in Hugging Face transformers (>= 5.15: earlier versions lack the `-` block or scan
wrongly beyond one chunk) and computes what nvfp4train computes: FP32 logits within 1e-4, the same
greedy tokens from `generate()`, the same tokenizer. For a BF16-trained and an NVFP4-trained run (the
latter evaluated with BF16 linears, as `python -m nvfp4train.eval` does)."""

import pytest
import torch

from nvfp4train.data import load_tokenizer
from nvfp4train.eval import load_run_model
from nvfp4train.export import main
from tests.conftest import run_train
from tests.eval.conftest import TINY

transformers = pytest.importorskip("transformers")
if tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 15):
    pytest.skip(f"transformers {transformers.__version__} < 5.15 has no correct Nemotron-H", allow_module_level=True)


@pytest.fixture(scope="module")
def nvfp4_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "nvfp4"
    run_train(f"out_dir={out}", "precision=nvfp4", *TINY)
    return out


def greedy(model, ids, n):
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("which", ["bf16", "nvfp4"])
def test_from_pretrained_matches_our_forward(which, tiny_run, nvfp4_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tiny_run if which == "bf16" else nvfp4_run
    out = tmp_path / "export"
    assert main([f"run_dir={run_dir}", f"out={out}"]) == 0
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "NemotronHForCausalLM"
    ours, config, _ = load_run_model(run_dir)
    assert config["precision"]["name"] == which
    # 150 tokens: beyond the 64-token SSD chunk, so the scan's carry between chunks is compared too.
    ids = torch.randint(0, config["model"]["vocab_size"], (2, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
    assert diff <= 1e-4, diff

    tokenizer = AutoTokenizer.from_pretrained(out)
    ours_tok = load_tokenizer(config["data"]["tokenizer"])
    text = "The history of the city begins in 1200.\n  def f(x):\treturn x"
    assert tokenizer(text).input_ids == ours_tok.encode(text)
    assert tokenizer.eos_token_id == ours_tok.eos_id and tokenizer.decode(ours_tok.encode(text)) == text
    prompt = torch.tensor([ours_tok.encode("The history of the city")])
    generated = hf.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert torch.equal(generated, greedy(ours, prompt, 12))
