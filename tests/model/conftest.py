import pytest
import torch

# A small model with all three block types, groups > 1, GQA and a sequence that spans several
# SSD chunks: big enough to exercise every code path, small enough for 2 CPU cores.
SMALL = {
    "name": "test_small",
    "pattern": "M*-M",
    "vocab_size": 97,
    "d_model": 32,
    "ffn_hidden": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 8,
    "mamba_groups": 2,
    "mamba_state": 8,
    "mamba_head_dim": 8,
    "mamba_chunk": 8,
    "ssd_backend": "torch",
}


@pytest.fixture
def small_cfg_dict():
    return dict(SMALL)


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
