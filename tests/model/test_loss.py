"""The chunked linear cross-entropy equals F.cross_entropy of the full logits: loss and gradients,
in FP32 and under BF16 autocast, for chunks that do and do not divide the token count, with ignored
tokens and with large logits (compiled: tests/model/test_compile.py); eager, its in-place arithmetic gives the
compiled formulation's numbers bit for bit."""

import pytest
import torch
import torch.nn.functional as F

from nvfp4train.model import linear_cross_entropy
from nvfp4train.model.loss import _chunk_loss_eager, _chunk_loss_traced


def _inputs(n=37, d=16, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(vocab, d, generator=g)).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [5, 37, 100])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_matches_cross_entropy_fp32(chunk, reduction):
    h1, w1, y = _inputs()
    h2, w2 = h1.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()
    ref = F.cross_entropy(F.linear(h1, w1), y, reduction=reduction)
    out = linear_cross_entropy(h2, w2, y, reduction=reduction, chunk_tokens=chunk)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    (ref * 1.7).backward()
    (out * 1.7).backward()
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-7)


def test_matches_autocast_bf16_logits_and_ignores_index():
    h1, w1, y = _inputs(n=24, seed=1)
    y[3] = y[10] = -100
    h2, w2 = h1.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h1, w1).float(), y)
        out = linear_cross_entropy(h2, w2, y, chunk_tokens=7)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # the same BF16 GEMM, FP32 softmax
    ref.backward()
    out.backward()
    assert w2.grad.dtype == torch.float32 and h2.grad.dtype == torch.float32
    # BF16 GEMMs of the logits' gradients: equal up to BF16 rounding (of each chunk's sum, here)
    for mine, ref in ((h2.grad, h1.grad), (w2.grad, w1.grad)):
        assert ((mine - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("autocast", [False, True])
def test_loss_and_gradients_with_ignored_tokens(autocast):
    """Against F.cross_entropy's autograd with a non-default ignore_index: ignored tokens, one chunk
    made only of them, add nothing to the loss, to the mean's count or to the gradients."""
    h1, w1, y = _inputs(n=29, vocab=300, seed=2)
    y[[0, 4, 11]] = -1
    y[20:25] = -1  # the fifth chunk of 5
    h2, w2 = h1.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ref = F.cross_entropy(F.linear(h1, w1).float(), y, ignore_index=-1)
        out = linear_cross_entropy(h2, w2, y, chunk_tokens=5, ignore_index=-1)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    (2.3 * ref).backward()
    (2.3 * out).backward()
    assert torch.all(h2.grad[y == -1] == 0)
    if autocast:  # BF16 logits' gradients, rounded after the 1/N there and before it here
        for mine, ref in ((h2.grad, h1.grad), (w2.grad, w1.grad)):
            assert ((mine - ref).norm() / ref.norm()).item() < 1e-2
    else:
        torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-7)


def test_large_logits():
    """Logits in the hundreds, where exp overflows FP32 unless the row's max is subtracted first."""
    h1, w1, y = _inputs(seed=3)
    h1 = (200 * h1).detach().requires_grad_()
    h2, w2 = h1.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()
    ref = F.cross_entropy(F.linear(h1, w1), y)
    out = linear_cross_entropy(h2, w2, y, chunk_tokens=8)
    assert F.linear(h1, w1).abs().max() > 200
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)
    ref.backward()
    out.backward()
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eager_chunk_loss_is_bitwise_the_traced_one(dtype):
    """The eager chunk (one FP32 copy, shifted, exponentiated and -1'd in place) against the out-of-place
    expressions torch.compile sees: the same loss and logits' gradient bit for bit (signs of zeros too),
    with ignored tokens, logits in the hundreds, a vocabulary that is no multiple of a vector's width, and
    without gradients (evaluation); the caller's logits are left as they were."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(67, 1003, generator=g) * torch.logspace(-1, 2.5, 67).unsqueeze(-1)).to(dtype)
    targets = torch.randint(0, 1003, (67,), generator=g)
    targets[[0, 9, 66]] = -100
    valid, index = (targets != -100).unsqueeze(-1), targets.clamp(min=0).unsqueeze(-1)
    given = logits.clone()
    loss, grad = _chunk_loss_traced(logits, index, valid, True)
    eager_loss, eager_grad = _chunk_loss_eager(logits, index, valid, True)
    assert torch.equal(logits, given)  # in place on its own copy, also of FP32 logits
    assert torch.equal(eager_loss, loss) and eager_loss.dtype == torch.float32
    assert torch.equal(eager_grad, grad) and torch.equal(eager_grad.signbit(), grad.signbit())
    assert torch.all(eager_grad[[0, 9, 66]] == 0) and (eager_grad.sum(-1)[1:9].abs() < 1e-5).all()
    assert _chunk_loss_eager(logits, index, valid, False) == (loss, None)
