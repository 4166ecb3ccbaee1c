"""The Mamba mixer's conv, scan and gated norm as one op (model/mixer_op.py) against the same kernels run as
separate layers: the same output, the same gradients up to mamba-ssm's atomic adds, in_proj's output gradient
written as one tensor. On a GPU with mamba-ssm's Triton kernels (marked gpu); on CPU the mixer never takes it."""

from __future__ import annotations

import pytest
import torch

from nvfp4train.model import blocks
from nvfp4train.model.config import ModelConfig
from nvfp4train.model.layers import PLAIN_LAYERS
from nvfp4train.model.mixer_op import mamba_conv_scan_norm, mixer_op_applies


def test_the_mixer_takes_the_op_on_cuda_only():
    assert not mixer_op_applies(False, "auto")
    assert not mixer_op_applies(False, "triton")


def _mixer(device) -> blocks.Mamba2Mixer:
    cfg = ModelConfig(d_model=256, mamba_state=64, mamba_head_dim=64, mamba_groups=2, mamba_chunk=64)
    torch.manual_seed(0)
    return blocks.Mamba2Mixer(cfg, 0, PLAIN_LAYERS).to(device)


def _run(mixer, u, grad, fused: bool, monkeypatch):
    monkeypatch.setattr(blocks, "mixer_op_applies", lambda is_cuda, backend: fused and is_cuda)
    for p in mixer.parameters():
        p.grad = None
    x = u.detach().clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mixer(x)
    (y.float() * grad).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in mixer.named_parameters()}


@pytest.mark.gpu
def test_one_op_equals_the_separate_layers(cuda_device, monkeypatch):
    from nvfp4train.model.fused_norm import fused_norm_available
    from nvfp4train.model.ops import triton_ssd_available

    if not (triton_ssd_available() and fused_norm_available()):
        pytest.skip("mamba-ssm Triton kernels not importable")
    mixer = _mixer(cuda_device)
    assert mixer_op_applies(True, mixer.ssd_backend)
    gen = torch.Generator(device=cuda_device).manual_seed(1)
    u = torch.randn(2, 300, 256, device=cuda_device, generator=gen)
    grad = torch.randn(2, 300, 256, device=cuda_device, generator=gen)
    y_op, dx_op, grads_op = _run(mixer, u, grad, True, monkeypatch)
    y_ref, dx_ref, grads_ref = _run(mixer, u, grad, False, monkeypatch)
    assert torch.equal(y_op, y_ref)
    torch.testing.assert_close(dx_op, dx_ref, rtol=1e-3, atol=1e-3 * dx_ref.abs().max().item())
    for name, g in grads_op.items():
        want = grads_ref[name]
        torch.testing.assert_close(
            g, want, rtol=1e-3, atol=1e-3 * want.abs().max().item(), msg=lambda m: f"{name}: {m}"
        )


@pytest.mark.gpu
def test_op_passes_opcheck(cuda_device):
    from nvfp4train.model.fused_norm import fused_norm_available
    from nvfp4train.model.ops import triton_ssd_available

    if not (triton_ssd_available() and fused_norm_available()):
        pytest.skip("mamba-ssm Triton kernels not importable")
    m = _mixer(cuda_device)
    gen = torch.Generator(device=cuda_device).manual_seed(2)
    zxbcdt = torch.randn(2, 128, m.in_proj.out_features, device=cuda_device, generator=gen).bfloat16()
    args = (
        zxbcdt.requires_grad_(),
        m.conv1d.weight.detach().requires_grad_(),
        m.conv1d.bias.detach().requires_grad_(),
        (-torch.exp(m.A_log.float())).detach().requires_grad_(),
        m.D.detach().requires_grad_(),
        m.dt_bias.detach().requires_grad_(),
        m.norm.weight.detach().requires_grad_(),
        m.norm.eps,
        m.d_inner,
        m.head_dim,
        m.groups,
        m.norm.group_size,
        m.chunk,
    )
    torch.library.opcheck(mamba_conv_scan_norm, args)
