"""HybridLM behaviour: causality, the layer-factory protocol, init, parameter groups."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nvfp4train.model import HybridLM, ModelConfig, build_model, param_groups


def assert_causal(model, vocab, T=24, cut=13, device="cpu"):
    torch.manual_seed(1)
    tokens = torch.randint(0, vocab, (2, T), device=device)
    changed = tokens.clone()
    changed[:, cut:] = (tokens[:, cut:] + 1 + torch.randint(0, vocab - 1, (2, T - cut), device=device)) % vocab
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, T, vocab)
    torch.testing.assert_close(a[:, :cut], b[:, :cut], rtol=0, atol=1e-5)
    assert (a[:, cut:] - b[:, cut:]).abs().max() > 1e-3  # the future did change


@pytest.mark.parametrize("pattern", ["M*-M", "*-*-", "MM", "M"])
def test_changing_future_tokens_never_changes_past_logits(small_cfg_dict, pattern):
    cfg = {**small_cfg_dict, "pattern": pattern}
    assert_causal(build_model(cfg), cfg["vocab_size"])


def test_causal_with_rope(small_cfg_dict):
    cfg = {**small_cfg_dict, "pattern": "*-", "rope": True}
    assert_causal(build_model(cfg), cfg["vocab_size"])


def test_rope_changes_attention_output(small_cfg_dict):
    torch.manual_seed(0)
    plain = build_model({**small_cfg_dict, "pattern": "*"})
    roped = build_model({**small_cfg_dict, "pattern": "*", "rope": True})
    roped.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        a, b = plain(tokens), roped(tokens)
    torch.testing.assert_close(a[:, 0], b[:, 0])  # position 0 is not rotated
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_causal_on_gpu(small_cfg_dict, cuda_device, backend):
    from nvfp4train.model.ops import triton_ssd_available

    if backend == "triton" and not triton_ssd_available():
        pytest.skip("mamba-ssm Triton SSD not importable")
    cfg = {**small_cfg_dict, "ssd_backend": backend, "mamba_head_dim": 16, "mamba_state": 16}
    model = build_model(cfg).to(cuda_device)
    assert_causal(model, cfg["vocab_size"], T=96, cut=50, device=cuda_device)


class RecordingLinear(nn.Module):
    """A stand-in for a quantized linear: same protocol, counts its calls."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x @ self.weight.T


def test_layer_factory_gets_every_block_linear_and_nothing_else(small_cfg_dict):
    requests, made, strided = [], [], []

    class Recording:
        def linear(self, in_features, out_features, *, block_index, name, strided_output=False):
            requests.append((block_index, name, in_features, out_features))
            strided.append(strided_output)
            made.append(RecordingLinear(in_features, out_features))
            return made[-1]

        def mlp(self, in_features, hidden_features, *, block_index):
            return None

    model = build_model(small_cfg_dict, layer_factory=Recording())
    cfg = model.cfg
    expected = []
    for i, kind in enumerate(cfg.pattern):
        if kind == "M":
            expected += [
                (i, "in_proj", cfg.d_model, cfg.mamba_in_proj_dim),
                (i, "out_proj", cfg.mamba_d_inner, cfg.d_model),
            ]
        elif kind == "*":
            expected += [
                (i, "qkv", cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim),
                (i, "out", cfg.n_heads * cfg.head_dim, cfg.d_model),
            ]
        else:
            expected += [(i, "fc1", cfg.d_model, cfg.ffn_hidden), (i, "fc2", cfg.ffn_hidden, cfg.d_model)]
    assert requests == expected
    assert strided == [name == "in_proj" for _, name, _, _ in expected]  # in_proj's output is only split
    # The model really uses the factory's modules (no fused path around out_proj), and
    # nothing else is a Linear: embedding, norms, conv and LM head stay high precision.
    model(torch.randint(0, 97, (1, 9)))
    assert all(m.calls == 1 for m in made)
    other_linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert other_linears == ["lm_head"]
    assert [(b.index, b.kind) for b in model.blocks] == list(enumerate(cfg.pattern))


def test_default_linears_have_no_bias(small_cfg_dict):
    model = build_model(small_cfg_dict)
    assert not [n for n, _ in model.named_parameters() if n.endswith(".bias") and "conv1d" not in n]


def test_init_stds_follow_megatron():
    cfg = ModelConfig.from_dict(
        {
            "pattern": "M*-" * 4,
            "d_model": 256,
            "ffn_hidden": 1024,
            "n_heads": 8,
            "n_kv_heads": 2,
            "head_dim": 32,
            "mamba_head_dim": 64,
            "mamba_groups": 2,
            "init_std": 0.02,
            "vocab_size": 4096,
        }
    )
    torch.manual_seed(0)
    model = HybridLM(cfg)
    out_std = 0.02 / math.sqrt(2 * cfg.n_blocks)
    m, a, f = model.blocks[0].mixer, model.blocks[1].mixer, model.blocks[2].mixer
    for w, std in [
        (model.embedding.weight, 0.02),
        (model.lm_head.weight, 0.02),
        (m.in_proj.weight, 0.02),
        (a.qkv.weight, 0.02),
        (f.fc1.weight, 0.02),
        (m.out_proj.weight, out_std),
        (a.out.weight, out_std),
        (f.fc2.weight, out_std),
    ]:
        assert abs(w.std().item() / std - 1) < 0.05, (w.shape, w.std().item(), std)
    # Mamba-2 SSM parameters: A = -exp(A_log) in [-16, -1], D = 1, softplus(dt_bias) in [1e-3, 0.1].
    A = -torch.exp(m.A_log)
    assert (A <= -1).all() and (A >= -16).all()
    assert torch.equal(m.D, torch.ones_like(m.D))
    dt = F.softplus(m.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert torch.equal(model.blocks[0].norm.weight, torch.ones(cfg.d_model))


def test_param_groups_split_matrices_from_vectors(small_cfg_dict):
    model = build_model(small_cfg_dict)
    groups = param_groups(model, weight_decay=0.1)
    decay = {id(p) for p in groups[0]["params"]}
    no_decay = {id(p) for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert not decay & no_decay
    named = dict(model.named_parameters())
    assert decay | no_decay == {id(p) for p in named.values()}
    for name, p in named.items():
        in_no_decay = id(p) in no_decay
        assert in_no_decay == (p.ndim < 2 or name.endswith(".bias")), name
    for name in [
        "blocks.0.mixer.A_log",
        "blocks.0.mixer.D",
        "blocks.0.mixer.dt_bias",
        "blocks.0.mixer.conv1d.bias",
        "blocks.0.norm.weight",
        "blocks.0.mixer.norm.weight",
        "final_norm.weight",
    ]:
        assert id(named[name]) in no_decay, name
    for name in ["embedding.weight", "lm_head.weight", "blocks.0.mixer.in_proj.weight", "blocks.2.mixer.fc2.weight"]:
        assert id(named[name]) in decay, name
    torch.optim.AdamW(groups, lr=1e-3)  # accepted as-is


def test_a_few_adamw_steps_fit_a_fixed_batch(small_cfg_dict):
    torch.manual_seed(0)
    model = build_model(small_cfg_dict)
    tokens = torch.randint(0, 97, (4, 33))
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-2)
    losses = []
    for _ in range(12):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 97), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(97)) < 0.1  # small init: uniform predictions at start
    assert losses[-1] < losses[0] - 1.0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_autocast_forward_backward(small_cfg_dict):
    model = build_model(small_cfg_dict)
    tokens = torch.randint(0, 97, (2, 20))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert model.blocks[0].mixer.A_log.grad is not None and model.blocks[0].mixer.A_log.dtype == torch.float32
    with torch.no_grad():
        ref = model(tokens)
    assert ((logits.float() - ref).norm() / ref.norm()) < 0.05


def test_block_norms_write_the_autocast_dtype_with_the_same_bits(small_cfg_dict, monkeypatch):
    """Under autocast a block's norm writes BF16 (its mixer's first linear would cast to it anyway):
    logits and every gradient equal those of an FP32 norm output cast by the linear, bit for bit (the
    PyTorch norm; the Triton one on CUDA is within its last bit: tests/gpu/test_fused_norm.py)."""
    from nvfp4train.model import blocks

    model = build_model({**small_cfg_dict, "pattern": "M*-M"})
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(0))
    seen = []
    monkeypatch.setattr(
        blocks.MLP, "forward", lambda self, x: seen.append(x.dtype) or self.fc2(F.relu(self.fc1(x)).square())
    )

    def logits_and_grads():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        logits.float().square().mean().backward()
        return [logits.detach()] + [p.grad.clone() for p in model.parameters()]

    fast = logits_and_grads()
    assert seen == [torch.bfloat16]

    def fp32_norm_output(self, x, h=None):
        x = x if h is None else x + h
        return x, self.mixer(self.norm(x))

    monkeypatch.setattr(blocks.Block, "forward", fp32_norm_output)
    slow = logits_and_grads()
    assert seen[-1] == torch.float32
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


def test_meta_device_build_allocates_nothing():
    with torch.device("meta"):
        model = build_model(
            {
                "pattern": "M*-",
                "d_model": 1024,
                "vocab_size": 131072,
                "n_heads": 8,
                "n_kv_heads": 8,
                "head_dim": 128,
                "mamba_head_dim": 64,
                "mamba_groups": 8,
                "ffn_hidden": 4096,
            }
        )
    assert all(p.is_meta for p in model.parameters())
    assert model.num_params() > 268_000_000


def test_meta_build_then_materialize_and_reset(small_cfg_dict):
    with torch.device("meta"):
        model = build_model(small_cfg_dict)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters(include_ssm_and_norms=True)
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
    mixer = model.blocks[0].mixer
    assert torch.equal(mixer.D, torch.ones_like(mixer.D))
    assert torch.equal(mixer.norm.weight, torch.ones_like(mixer.norm.weight))
    assert (-torch.exp(mixer.A_log) <= -1).all()
    logits = model(torch.randint(0, 97, (1, 12)))
    assert abs(F.cross_entropy(logits[0], torch.randint(0, 97, (12,))).item() - math.log(97)) < 0.1
