"""Incremental decoding (nvfp4train.model.decode): prefill + one token at a time gives the logits of the full
forward over the whole sequence, for the hybrid (Mamba state + attention KV cache) and a RoPE Transformer,
and leaves the training forward as it was (same bits, no hooks left)."""

import pytest
import torch

from nvfp4train.model import build_model
from nvfp4train.model.decode import decode_step, prefill

HYBRID = {"pattern": "M-*-M-", "vocab_size": 256, "mamba_chunk": 16}
ROPE = {"pattern": "*-*-", "vocab_size": 256, "rope": True}


@pytest.mark.parametrize("config", [HYBRID, ROPE, {**HYBRID, "mamba_conv": 1}], ids=["hybrid", "rope", "conv1"])
@pytest.mark.parametrize("prompt_len", [2, 37])  # shorter than the conv window; beyond two SSD chunks
def test_cached_decode_equals_the_full_forward(config, prompt_len):
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():  # larger dt and A than the init, so the state carries and decays visibly
        for block in model.blocks:
            if block.kind == "M":
                block.mixer.dt_bias.add_(1.0)
    tokens = torch.randint(0, 256, (3, prompt_len + 12))
    with torch.no_grad():
        full = model(tokens)
        prompt_only = model(tokens[:, :prompt_len])
    logits, cache = prefill(model, tokens[:, :prompt_len])
    assert torch.equal(logits, prompt_only[:, -1])  # the prompt goes through the training forward
    worst = (logits - full[:, prompt_len - 1]).abs().max().item()
    for t in range(prompt_len, tokens.shape[1]):
        logits = decode_step(model, tokens[:, t], cache)
        worst = max(worst, (logits - full[:, t]).abs().max().item())
    assert cache.length == tokens.shape[1]
    assert worst <= 1e-4, worst


def test_prefill_leaves_the_training_forward_unchanged():
    torch.manual_seed(1)
    model = build_model(HYBRID)
    tokens = torch.randint(0, 256, (2, 20))
    before = model(tokens, targets=tokens)
    before.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    prefill(model.eval(), tokens)
    decode_step(model, tokens[:, 0], prefill(model, tokens)[1])
    model.train()
    assert all(not m._forward_hooks for m in model.modules())
    after = model(tokens, targets=tokens)
    after.backward()
    assert torch.equal(before, after)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_bf16_autocast_decode_stays_close():
    torch.manual_seed(2)
    model = build_model(HYBRID).eval()
    tokens = torch.randint(0, 256, (2, 30))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(tokens).float()
        _, cache = prefill(model, tokens[:, :20])
        steps = [decode_step(model, tokens[:, t], cache).float() for t in range(20, 30)]
    diff = max((s - full[:, t]).abs().max().item() for s, t in zip(steps, range(20, 30)))
    assert diff < 0.05 * full.abs().max().item(), diff


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_decode_on_cuda(dtype):
    """On a GPU the prompt goes through the CUDA kernels (mamba-ssm's SSD scan, the causal-conv kernel, the
    fused norms where installed), the steps through decode.py's recurrence: they still agree."""
    torch.manual_seed(3)
    model = build_model({**HYBRID, "mamba_chunk": 64}).cuda().eval()
    tokens = torch.randint(0, 256, (2, 150), device="cuda")
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        full = model(tokens).float()
        logits, cache = prefill(model, tokens[:, :130])
        worst = (logits.float() - full[:, 129]).abs().max().item()
        for t in range(130, 150):
            worst = max(worst, (decode_step(model, tokens[:, t], cache).float() - full[:, t]).abs().max().item())
    limit = 1e-3 if dtype == torch.float32 else 0.05 * full.abs().max().item()
    assert worst <= limit, worst
