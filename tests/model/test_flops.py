"""The FLOPs formula against torch.utils.flop_counter, and the MFU peak table."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from nvfp4train.model import ModelConfig, build_model, flops_per_token
from nvfp4train.model.mfu import lookup_peak, mfu, peak_flops


def counted_training_flops(model, tokens):
    """FLOPs of one forward + backward as torch's counter sees them.

    Two adjustments: attention runs on the math SDPA backend (the CPU flash kernel is not in
    the counter's table), and the counter's formula for the *backward* of a grouped conv
    treats it as dense (C_out x C_in), so that op is replaced by 2 x its forward count — the
    same two products (grad input, grad weight) a depthwise conv backward really does.
    """
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).sum().backward()
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    conv_fwd = by_op.get("aten.convolution", 0)
    conv_bwd = by_op.get("aten.convolution_backward", 0)
    return counter.get_total_flops() - conv_bwd + 2 * conv_fwd, by_op


@pytest.mark.parametrize(
    "pattern, T, chunk",
    [("M*-M", 32, 8), ("M*-M", 30, 8), ("M*-M", 5, 8), ("M*-M", 16, 16), ("*-*-", 20, 8), ("MM", 40, 16)],
)
def test_formula_equals_flop_counter(small_cfg_dict, pattern, T, chunk):
    torch.manual_seed(0)
    model = build_model({**small_cfg_dict, "pattern": pattern, "mamba_chunk": chunk})
    tokens = torch.randint(0, 97, (2, T))
    counted, by_op = counted_training_flops(model, tokens)
    predicted = flops_per_token(model.cfg, T, causal=False)["total"] * tokens.numel()
    assert counted == pytest.approx(predicted, rel=1e-12), by_op


def test_per_block_type_terms_add_up_and_match_hand_counts():
    cfg = ModelConfig()  # hybrid_tiny
    T = 256
    f = flops_per_token(cfg, T, causal=False)
    assert f["total"] == pytest.approx(f["mamba"] + f["attention"] + f["mlp"] + f["lm_head"])
    assert f["forward"] == pytest.approx(f["total"] / 3)
    d, V = cfg.d_model, cfg.vocab_size
    assert f["lm_head"] == 6 * d * V
    assert f["mlp"] == cfg.count("-") * 6 * 2 * d * cfg.ffn_hidden
    attn_linear = 2 * d * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + 2 * cfg.n_heads * cfg.head_dim * d
    assert f["attention"] == cfg.count("*") * 3 * (attn_linear + 4 * T * cfg.n_heads * cfg.head_dim)


def test_causal_counts_half_of_the_quadratic_terms():
    cfg = ModelConfig.from_dict({"pattern": "*", "d_model": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16})
    dense, causal = flops_per_token(cfg, 1024, causal=False), flops_per_token(cfg, 1024, causal=True)
    quadratic = 3 * 4 * 1024 * 64
    assert dense["attention"] - causal["attention"] == pytest.approx(quadratic / 2)
    # Mamba: the causal count is below the dense one but the linear layers dominate both.
    cfg_m = ModelConfig.from_dict({"pattern": "M"})
    dm, cm = flops_per_token(cfg_m, 256, causal=False)["mamba"], flops_per_token(cfg_m, 256)["mamba"]
    assert 0.5 * dm < cm < dm


def test_12b_flops_close_to_6n_plus_attention_and_scan():
    from pathlib import Path

    import yaml

    d = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/model/nemotron_h_12b.yaml").read_text())
    cfg = ModelConfig.from_dict(d)
    f = flops_per_token(cfg, 8192)
    with torch.device("meta"):
        n_matmul_params = build_model(cfg).num_params() - cfg.vocab_size * cfg.d_model  # embedding is a lookup
    # Linear layers give 6 FLOPs per parameter; the scan, conv and attention add a few percent.
    assert 1.0 < f["total"] / (6 * n_matmul_params) < 1.15


def test_seq_len_must_be_positive():
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(ModelConfig(), 0)


@pytest.mark.parametrize(
    "device_name, precision, expected_flops, label_word",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "fp8", 1978.9e12, "FP8"),
        ("NVIDIA H100 PCIe", "bf16", 756e12, "H100 PCIe"),
        ("NVIDIA H200", "bf16", 989.4e12, "H200"),
        ("NVIDIA B200", "fp4", 9000e12, "B200"),
        ("NVIDIA GB200", "fp4", 10000e12, "GB200"),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12, "A100"),
        ("NVIDIA GH200 480GB", "bf16", 989.4e12, "GH200"),
        ("NVIDIA H20", "fp8", 296e12, "H20 dense"),
        ("NVIDIA H200 NVL", "bf16", 835.5e12, "H200 NVL"),
    ],
)
def test_peak_table_lookup(device_name, precision, expected_flops, label_word):
    flops, label = lookup_peak(device_name, precision)
    assert flops == pytest.approx(expected_flops)
    assert label_word in label and "dense" in label


def test_peak_unknown_or_unsupported_is_none():
    assert lookup_peak("NVIDIA H100 80GB HBM3", "fp4") is None  # Hopper has no FP4 tensor cores
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert lookup_peak("Some Future GPU", "bf16") is None
    with pytest.raises(ValueError, match="precision"):
        lookup_peak("NVIDIA H100", "int8")


def test_no_peak_and_no_mfu_on_cpu():
    assert peak_flops("cpu", "bf16") is None
    assert mfu(1e9, 1e5, device="cpu") is None
    if not torch.cuda.is_available():
        assert peak_flops(None, "bf16") is None


@pytest.mark.gpu
def test_mfu_on_this_gpu(cuda_device):
    peak = peak_flops(cuda_device, "bf16")
    if peak is None:
        pytest.skip(f"{torch.cuda.get_device_name()} not in the peak table")
    flops, label = peak
    value, label2 = mfu(flops / 1e6, 5e5, device=cuda_device)
    assert value == pytest.approx(0.5) and label2 == label
