"""precision/cpu_bf16.py: on a CPU without BF16 instructions, BF16 products run as FP32 GEMMs of the same
values rounded once, which is what a BF16 GEMM computes; the trainer and the evaluations use it there."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from nvfp4train.precision import cpu_bf16
from nvfp4train.precision.cpu_bf16 import FP32GemmForBF16, cpu_bf16_matmuls


def _ints(*shape, seed=0):
    """BF16 integers small enough that every product and sum is exact in FP32: any sum order gives these bits."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, shape, generator=g).to(torch.bfloat16)


def _wide(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("make", [_ints, _wide])
def test_each_product_is_the_fp32_gemm_of_the_same_values_rounded_once(make):
    a, b, c = make(48, 40), make(40, 24, seed=1), make(48, 24, seed=2)
    x, y, z = make(3, 16, 40), make(3, 40, 8, seed=1), make(3, 16, 8, seed=2)
    cases = [
        (torch.mm, (a, b), {}),
        (torch.mm, (a, b.t().contiguous().t()), {}),  # a transposed operand
        (torch.addmm, (c, a, b), {"beta": 0.5, "alpha": 2.0}),
        (torch.bmm, (x, y), {}),
        (torch.baddbmm, (z, x, y), {"beta": 2.0, "alpha": -1.0}),
    ]
    for op, args, kwargs in cases:
        native = op(*args, **kwargs)
        with FP32GemmForBF16():
            got = op(*args, **kwargs)
        want = op(*[t.float() for t in args], **kwargs).to(torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), op.__name__
        if make is _ints:  # exact sums: the same bits as PyTorch's own BF16 GEMM
            assert torch.equal(got, native), op.__name__
        else:  # another FP32 sum order: at most one BF16 step apart
            assert torch.allclose(got.float(), native.float(), rtol=2**-7, atol=0), op.__name__


def test_a_linear_under_autocast_forward_and_backward():
    """Autocast casts the FP32 weight to BF16 before the mode sees the product; the backward's products, run
    inside the mode, give the gradients PyTorch's BF16 GEMMs give (exact values: the same bits)."""

    def run(mode):
        w = _ints(24, 40, seed=3).float().requires_grad_()
        x = _ints(2, 16, 40, seed=4).float().requires_grad_()
        with mode:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = F.linear(x, w)
            (y.float() * _ints(2, 16, 24, seed=5).float()).sum().backward()
        return y, x.grad, w.grad

    native, ours = run(contextlib.nullcontext()), run(FP32GemmForBF16())
    for n, o in zip(native, ours, strict=True):
        assert n.dtype == o.dtype and torch.equal(n, o)


def test_used_only_on_a_cpu_without_bf16_instructions(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "cpu_has_bf16_gemm", lambda: False)
    assert isinstance(cpu_bf16_matmuls("cpu"), FP32GemmForBF16)
    assert not isinstance(cpu_bf16_matmuls("cpu", enabled=False), FP32GemmForBF16)  # FP32 compute: nothing to do
    assert not isinstance(cpu_bf16_matmuls(torch.device("meta")), FP32GemmForBF16)
    monkeypatch.setattr(cpu_bf16, "cpu_has_bf16_gemm", lambda: True)
    assert not isinstance(cpu_bf16_matmuls("cpu"), FP32GemmForBF16)


def test_the_training_step_runs_its_products_through_it(monkeypatch):
    """The engine's CPU step (forward and backward) runs inside the mode where the CPU lacks BF16 GEMMs, and its
    loss and gradients are those of PyTorch's BF16 GEMMs up to FP32 sum order."""
    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig, param_groups
    from nvfp4train.optim import OptimConfig
    from nvfp4train.parallel import DistInfo
    from nvfp4train.train.engines import TorchEngine

    seen = []

    class Counting(FP32GemmForBF16):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in cpu_bf16.MATMULS and cpu_bf16._bf16_cpu(args[0]):
                seen.append(func)
            return super().__torch_dispatch__(func, types, args, kwargs)

    cfg = ModelConfig.from_dict(load_preset("model", "hybrid_tiny"))
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    tokens = torch.randint(0, cfg.vocab_size, (2, 65), generator=torch.Generator().manual_seed(0))
    batch = [(tokens[:, :-1], tokens[:, 1:])]
    losses, grads = [], []
    for lacks in (False, True):
        monkeypatch.setattr(cpu_bf16, "cpu_has_bf16_gemm", lambda lacks=lacks: not lacks)
        monkeypatch.setattr(cpu_bf16, "FP32GemmForBF16", Counting)
        torch.manual_seed(0)
        model = HybridLM(cfg)
        engine = TorchEngine(model, lambda m: param_groups(m, 0.1), OptimConfig(), "ddp", info)
        params = [p for p in model.parameters()]

        def record():  # the gradients the step made, before the optimizer would use them
            grads.append(torch.cat([p.grad.flatten() for p in params if p.grad is not None]))

        monkeypatch.setattr(engine.optimizer, "step", record)
        stats = engine.train_step(batch, lr=1e-3, step=1)
        losses.append(stats.loss.item())
        assert bool(seen) == lacks  # no product through the mode on a CPU with BF16 GEMMs
    assert len(seen) > 20  # forward and backward products of every linear and the LM head
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
    assert torch.allclose(grads[1], grads[0], rtol=0.05, atol=1e-4)
