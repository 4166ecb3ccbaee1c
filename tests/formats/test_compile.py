"""torch.compile-friendliness of the training fast path, on CPU (the GPU twin is in test_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from nvfp4train.formats import nvfp4


@pytest.mark.slow
def test_nvfp4_fake_quantize_compiles_as_one_graph_with_the_same_bits():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    compiled = torch.compile(nvfp4.fake_quantize, fullgraph=True)  # fails on any graph break
    eager, s_eager = nvfp4.fake_quantize(x, (16, 16))
    fast, s_fast = compiled(x, (16, 16))
    assert torch.equal(eager, fast) and torch.equal(s_eager, s_fast)
