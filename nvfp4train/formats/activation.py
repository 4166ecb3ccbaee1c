"""Activations a quantizer can apply to its input as it reads it (a prologue), so that the activation's output is
never written: the squared ReLU of Nemotron-H's MLP, forward and backward.

    squared_relu(a)           = relu(a)²                        (fc2's input h from fc1's output a)
    squared_relu_grad(dh, a)  = 0 where a <= 0, else dh · 2a    (fc1's dY from fc2's dX)

Both take and return bf16 (or any float dtype) and round once: a product of two bf16 values is exact in FP32, so
eager PyTorch (the product rounded to bf16), inductor's fused kernels (FP32 arithmetic, one rounding) and the
quantizer kernels' prologue (`kernels.common.apply_prologue`) give the same bits, and the same as autograd's
gradient of `F.relu(a).square()` (pow's `grad · (2 · r)`, then relu's `where(r <= 0, 0, ·)`). A NaN in a stays NaN
in both.
"""

from __future__ import annotations

import torch

PROLOGUES = ("squared_relu", "squared_relu_grad")
GRADIENTS = {"squared_relu": "squared_relu_grad"}  # an activation -> the prologue giving its input's gradient


def squared_relu(a: torch.Tensor) -> torch.Tensor:
    return torch.relu(a).square()


def squared_relu_grad(dh: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.where(a <= 0, 0.0, dh * (2 * a)).to(dh.dtype)


def apply(prologue: str | None, x: torch.Tensor, act_input: torch.Tensor | None = None) -> torch.Tensor:
    """What a quantizer with `prologue` quantizes: x itself (None), squared_relu(x), or squared_relu_grad(x,
    act_input); ValueError in one line for another name or a missing or mismatched act_input."""
    if prologue is None:
        return x
    check(prologue, x, act_input)
    return squared_relu(x) if prologue == "squared_relu" else squared_relu_grad(x, act_input)


def check(prologue: str, x: torch.Tensor, act_input: torch.Tensor | None) -> None:
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue={prologue!r} is not supported; allowed: None, {', '.join(PROLOGUES)}")
    wants_input = prologue == "squared_relu_grad"
    if wants_input != (act_input is not None):
        raise ValueError(f"prologue={prologue!r}: act_input must be {'given' if wants_input else 'None'}")
    if wants_input and (act_input.shape != x.shape or act_input.dtype != x.dtype or act_input.device != x.device):
        raise ValueError(
            f"prologue={prologue!r}: act_input {tuple(act_input.shape)} {act_input.dtype} must match x "
            f"{tuple(x.shape)} {x.dtype} on {x.device}"
        )
