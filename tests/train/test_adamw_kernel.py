"""The AdamW step with the clipping coefficient in one Triton kernel (optim/adamw_kernel.py, ClippingAdamW).

On a GPU (marked gpu): ClippingAdamW against torch's clip (`_foreach_mul_`) then fused AdamW over several steps,
two parameter groups, a skipped step: the same bits in weights, moments and step counts. In Triton's interpreter on
CPU (a subprocess with TRITON_INTERPRET=1), against the kernel's arithmetic written out in PyTorch ops, over
parameters of several chunks and of a few elements, with and without weight decay, clipped, and skipped where
found_inf is set (the interpreter rounds a fused multiply-add twice, so there the reference does too)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import run_check_in_triton_interpreter

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
SIZES = (4096 * 2 + 5, 3, 4096)  # whole and partial chunks


def _reference_step(p, g, m, v, step, *, lr, beta1, beta2, weight_decay, eps, coef):
    """The kernel's arithmetic (fused AdamW's), op by op in FP32, with fma(a, b, c) as Triton's interpreter
    evaluates it: a * b + c."""
    lr, weight_decay, beta1, beta2, eps, step = (
        torch.tensor(x, dtype=torch.float32) for x in (lr, weight_decay, beta1, beta2, eps, float(step))
    )

    def fma(a, b, c):
        return a * b + c

    g = g * coef
    if weight_decay != 0:
        p = fma(-(lr * weight_decay), p, p)
    g2 = g * g
    m = fma(beta1, m, fma(-beta1, g, g))
    v = fma(beta2, v, fma(-beta2, g2, g2))
    step_size = lr / (1 - beta1**step)
    # the interpreter's square root rounds correctly (NumPy's); PyTorch's vectorised one on CPU need not
    denom = v.double().sqrt().float() / (1 - beta2**step).sqrt() + eps
    return p - (step_size * m) / denom, m, v


def _state(device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for n in SIZES:
        p, g, m = (torch.randn(n, generator=gen) for _ in range(3))
        v = torch.rand(n, generator=gen) * 1e-2
        tensors.append([t.to(device) for t in (p, g, m * 1e-2, v)])
    return tensors


def check(device: str) -> None:
    from nvfp4train.optim.adamw_kernel import StepTables, adamw_clip_step

    hyper = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8)
    for weight_decay in (0.1, 0.0):
        for coef in (1.0, 0.37):
            state = _state(device)
            params, grads, exp_avgs, exp_avg_sqs = (list(column) for column in zip(*state))
            expected = [
                _reference_step(*(t.cpu() for t in ts), 7, weight_decay=weight_decay, coef=coef, **hyper)
                for ts in state
            ]
            grads_before = [g.clone() for g in grads]
            steps = [torch.full((), 7.0, device=device) for _ in params]
            found_inf = torch.zeros((), device=device)
            coef_t = torch.full((), coef, device=device)
            adamw_clip_step(
                StepTables(), params, grads, exp_avgs, exp_avg_sqs, steps, weight_decay=weight_decay,
                clip_coef=coef_t, found_inf=found_inf, **hyper,
            )  # fmt: skip
            for got, want in zip(zip(params, exp_avgs, exp_avg_sqs), expected):
                for a, b in zip(got, want):
                    assert torch.equal(a.cpu(), b), (weight_decay, coef, (a.cpu() - b).abs().max().item())
            assert all(torch.equal(a, b) for a, b in zip(grads, grads_before))  # the gradients stay unclipped

    # found_inf set: nothing written
    state = _state(device, seed=1)
    before = [[t.clone() for t in ts] for ts in state]
    params, grads, exp_avgs, exp_avg_sqs = (list(column) for column in zip(*state))
    adamw_clip_step(
        StepTables(), params, grads, exp_avgs, exp_avg_sqs, [torch.full((), 2.0, device=device) for _ in params],
        weight_decay=0.1, clip_coef=torch.ones((), device=device), found_inf=torch.ones((), device=device), **hyper,
    )  # fmt: skip
    assert all(torch.equal(a, b) for ts, bs in zip(state, before) for a, b in zip(ts, bs))
    print("adamw kernel: ok")


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_adamw_kernel_in_the_interpreter():
    run_check_in_triton_interpreter("tests.train.test_adamw_kernel")


def test_clipping_adamw_falls_back_to_torch_on_cpu():
    """On CPU the optimizer is torch's AdamW after an in-place multiply by the coefficient: the same weights,
    moments and step counts as clip's `_foreach_mul_` then AdamW, the gradients clipped in place, and the step
    hooks run once a step."""
    from nvfp4train.optim.adamw import ClippingAdamW

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in SIZES]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = ClippingAdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    assert not opt.fuses_clipping()
    hook_calls = []
    opt.register_step_post_hook(lambda *_: hook_calls.append(1))
    for _ in range(3):
        for p, q in zip(params, ref):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt.clip_coef = torch.tensor(0.25)
        opt.step()
        torch._foreach_mul_([q.grad for q in ref], torch.tensor(0.25))
        ref_opt.step()
    assert all(torch.equal(p, q) and torch.equal(p.grad, q.grad) for p, q in zip(params, ref))
    assert torch.equal(opt.state[params[0]]["exp_avg_sq"], ref_opt.state[ref[0]]["exp_avg_sq"])
    assert len(hook_calls) == 3  # once a step, though torch wraps AdamW's step in its hook runner too


@pytest.mark.gpu
def test_clipping_adamw_is_clip_then_fused_adamw_on_the_gpu():
    """ClippingAdamW's kernel against `_foreach_mul_` by the coefficient then torch's fused AdamW, over 5 steps
    (the third skipped by found_inf), two groups (with and without weight decay): the same bits."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nvfp4train.optim.adamw import ClippingAdamW

    torch.manual_seed(0)
    shapes = [(2048, 2048), (8192, 2048), (2048,), (3,), (64, 4, 1)]
    params = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]

    def groups(ps):
        return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]

    opt = ClippingAdamW(groups(params), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    ref_opt = torch.optim.AdamW(groups(ref), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    assert opt.fuses_clipping()
    for step in range(5):
        for group, ref_group in zip(opt.param_groups, ref_opt.param_groups):
            group["lr"] = ref_group["lr"] = 3e-3 / (step + 1)
        grads = [torch.randn_like(p) * 10 ** (step - 2) for p in params]
        for p, q, g in zip(params, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        norm = torch.nn.utils.get_total_norm(grads)
        coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
        skip = torch.full((), float(step == 2), device="cuda")
        opt.clip_coef, opt.found_inf, ref_opt.found_inf = coef, skip, skip
        opt.step()
        torch._foreach_mul_([q.grad for q in ref], coef)
        ref_opt.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))  # unclipped in memory
        for p, q in zip(params, ref):
            a, b = opt.state[p], ref_opt.state[q]
            assert torch.equal(a["step"], b["step"]) and torch.equal(p, q), (step, p.shape)
            assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert opt.state[params[0]]["step"].item() == 4
