"""torch.compile: the training fast path compiles as one graph with the same bits (CPU; impl="auto"
runs the reference while dynamo traces)."""

from __future__ import annotations

import pytest
import torch

from nvfp4train.formats import nvfp4

pytestmark = pytest.mark.integration  # Inductor generates and compiles the quantizer's C++: not the quick loop


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


@pytest.mark.slow
def test_nvfp4_fake_quantize_compiles_as_one_graph_with_the_same_bits():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    x[3, :8] = -0.0  # the sign-of-zero rule must survive compilation
    compiled_fn = torch.compile(nvfp4.fake_quantize, fullgraph=True)  # fails on any graph break
    eager, s_eager = nvfp4.fake_quantize(x, (16, 16))
    fast, s_fast = compiled_fn(x, (16, 16))
    assert torch.equal(as_bits(eager), as_bits(fast)) and torch.equal(s_eager, s_fast)
