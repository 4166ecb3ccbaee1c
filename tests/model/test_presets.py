"""Parameter counts of the presets, built on the meta device (nothing is allocated)."""

from pathlib import Path

import pytest
import torch
import yaml

from nvfp4train.model import HybridLM, ModelConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"


def build_meta(name):
    cfg = ModelConfig.from_dict(yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text()))
    with torch.device("meta"):
        return HybridLM(cfg)


def analytic_params(cfg: ModelConfig) -> int:
    """Hand count, block by block (independent of the module code)."""
    d = cfg.d_model
    di, h, g, n = cfg.mamba_d_inner, cfg.mamba_heads, cfg.mamba_groups, cfg.mamba_state
    conv_dim = di + 2 * g * n
    mamba = d * (2 * di + 2 * g * n + h) + conv_dim * cfg.mamba_conv + conv_dim + 3 * h + di + di * d
    attention = d * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * cfg.head_dim * d
    mlp = 2 * d * cfg.ffn_hidden
    per_kind = {"M": mamba, "*": attention, "-": mlp}
    blocks = sum(per_kind[k] + d for k in cfg.pattern)  # + the block's pre-norm
    return blocks + 2 * cfg.vocab_size * d + d  # untied embedding + LM head + final norm


@pytest.mark.parametrize(
    "name, total, non_embedding",
    [
        # From the paper's architecture tables (arXiv 2509.25149 App. A.1-A.3) with vocab 131072:
        # 12B about 12.3B including untied embeddings; 1.2B 0.755B non-embedding plus 0.537B
        # embeddings = 1.29B; 8B: the paper's name.
        ("nemotron_h_12b", 12.31e9, None),
        ("nemotron_h_8b", 8.08e9, None),
        ("transformer_1p2b", 1.292e9, 0.755e9),
        ("hybrid_tiny", 2.8e6, None),
        ("hybrid_50m", 50e6, None),
        ("hybrid_125m", 124e6, None),
        ("hybrid_350m", 347e6, None),
        ("hybrid_1b", 0.98e9, None),
    ],
)
def test_preset_parameter_counts(name, total, non_embedding):
    model = build_meta(name)
    assert model.num_params() == analytic_params(model.cfg)
    assert model.num_params() == pytest.approx(total, rel=0.01)
    if non_embedding is not None:
        assert model.num_params(exclude_embeddings=True) == pytest.approx(non_embedding, rel=0.001)


def test_12b_block_mix_and_linear_count():
    model = build_meta("nemotron_h_12b")
    kinds = [b.kind for b in model.blocks]
    assert len(kinds) == 62 and kinds.count("M") == 28 and kinds.count("*") == 6 and kinds.count("-") == 28
    assert kinds[:2] == ["M", "-"] and "".join(kinds[-8:]) == "M-M-M-M-"  # the BF16 blocks of the recipe
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 62 * 2 + 1  # two per block (arXiv 2509.25149 App. A.1) + LM head


@pytest.mark.parametrize("name", ["hybrid_50m", "hybrid_125m", "hybrid_350m", "hybrid_1b"])
def test_siblings_keep_all_three_block_types(name):
    cfg = build_meta(name).cfg
    assert cfg.count("M") >= 4 * cfg.count("*") - 1 and cfg.count("*") >= 1 and cfg.count("-") >= cfg.count("M") - 1


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_config_parameter_count_is_the_built_models(name):
    """ModelConfig.num_params (what the trainer's memory checks read, without building a model) is the count of
    the model built, plain and with a precision policy's layers, for every preset."""
    from nvfp4train.precision import PrecisionPolicy, build_linear_factory

    model = build_meta(name)
    cfg = model.cfg
    for exclude in (False, True):
        assert cfg.num_params(exclude_embeddings=exclude) == model.num_params(exclude_embeddings=exclude)
    factory = build_linear_factory(
        PrecisionPolicy.from_dict({"format": "nvfp4"}), n_blocks=cfg.n_blocks, seed=0, modules=cfg.linear_modules()
    )
    with torch.device("meta"):
        quantized = HybridLM(cfg, layer_factory=factory)
    assert cfg.num_params() == quantized.num_params()
