"""Nemotron-H's MLP, fc2(relu(fc1(x))²), as one autograd node when both linears are quantized to FP8: fc2's
quantizers read fc1's output a and square its positive part as they load it, and fc1's gradient quantizers read
fc2's dX (dh) and a and apply the activation's derivative as they load them (`formats.activation`, the kernels'
prologue). Neither h = relu(a)² nor its gradient is written: per MLP, a write and a read of h forward and of the
activation's gradient backward, about 4 bytes an element of h each way (h is [tokens, ffn_hidden], the widest
activation of the block).

The GEMMs, quantizers, weight cache and SR streams are the layers' own custom ops (`ops.py`), called in the order
the separate layers call them, so the output and every gradient are the separate layers' bits
(`tests/precision/test_mlp.py`). The layer factory's `mlp` (controller.py) builds a `SquaredReLUMLP` for a block
whose fc1 and fc2 recipes fuse (`recipes_fuse`), which runs this node while `fuses_squared_relu` says both layers'
pairs of operands take a prologue (not after a switch to BF16) and its layers one by one otherwise; every other
block gets the model's own MLP (`model.blocks.MLP`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nvfp4train.formats import activation

from . import ops, pairs
from .linear import QuantLinear
from .recipe import LayerRecipe


def recipes_fuse(r1: LayerRecipe, r2: LayerRecipe) -> bool:
    """Whether an MLP whose fc1 runs `r1` and fc2 `r2` can run as one node: both quantized, fc2's X pair and fc1's
    dY pair FP8 (blockwise or per tensor)."""
    return (
        not r1.all_bf16
        and not r2.all_bf16
        and pairs.takes_prologue(r2.fprop_x, r2.wgrad_x)
        and pairs.takes_prologue(r1.dgrad_dy, r1.wgrad_dy)
    )


def fuses_squared_relu(fc1: torch.nn.Module, fc2: torch.nn.Module) -> bool:
    """Whether `squared_relu_mlp` would apply the activation inside the quantizers: both layers quantized on one
    backend, fc2's X pair and fc1's dY pair FP8 (blockwise or per tensor)."""
    if not (isinstance(fc1, QuantLinear) and isinstance(fc2, QuantLinear) and fc1.quantized and fc2.quantized):
        return False
    return fc1.backend_name == fc2.backend_name and not fc1.strided_output and recipes_fuse(fc1.recipe, fc2.recipe)


class SquaredReLUMLP(torch.nn.Module):
    """fc2(relu(fc1(x))²), the function of the model's MLP (`model.blocks.MLP`), with the same children `fc1` and
    `fc2`: one node (`squared_relu_mlp`) while `fuses_squared_relu(fc1, fc2)` holds, the layers one by one after
    a switch has made them BF16. What the layer factory's `mlp` returns where the recipes fuse."""

    def __init__(self, fc1: QuantLinear, fc2: QuantLinear):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fuses_squared_relu(self.fc1, self.fc2):
            return squared_relu_mlp(self.fc1, self.fc2, x)
        return self.fc2(F.relu(self.fc1(x)).square())


def squared_relu_mlp(fc1: QuantLinear, fc2: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """fc2(relu(fc1(x))²) as one node (`fuses_squared_relu(fc1, fc2)` must hold): the same output and gradients
    as the two layers and the activation one after the other."""
    grad = torch.is_grad_enabled()
    if torch.is_autocast_enabled(x.device.type):  # as QuantLinear.forward: the GEMM input in the autocast dtype
        x = x.to(torch.get_autocast_dtype(x.device.type))
    r1, r2 = fc1.recipe, fc2.recipe
    saves = (
        grad and fc1.weight.requires_grad,  # fc1: X for its Wgrad
        grad and x.requires_grad,  # fc1: W for its Dgrad
        grad and fc2.weight.requires_grad,
        grad and (x.requires_grad or fc1.weight.requires_grad),  # fc2's input a needs a gradient
    )
    # What backward needs to know of the recipes, read here from the layers (no recipe parsing in traced code):
    # how many packed-W tensors each Fprop returns, whether each layer's dY pair is quantized from one read.
    plan = (
        ops.packed_weight_count(r1, saves[1]),
        ops.packed_weight_count(r2, saves[3]),
        pairs.dy_pair(r1.dgrad_dy, r1.wgrad_dy),
        pairs.dy_pair(r2.dgrad_dy, r2.wgrad_dy),
    )
    return _SquaredReLUMLP.apply(
        x,
        fc1.weight,
        fc2.weight,
        (fc1.layer_id, fc2.layer_id),
        (fc1.recipe_key, fc2.recipe_key),
        fc1.backend_name,
        saves,
        plan,
    )


class _SquaredReLUMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2, layer_ids, recipe_keys, backend_name, saves, plan):
        (id1, id2), (key1, key2) = layer_ids, recipe_keys
        save_x1, save_w1, save_x2, save_w2 = saves
        n_w1, n_w2, _, _ = plan
        out1 = ops.quant_linear_fprop(x, w1, id1, key1, backend_name, x.dtype, save_x1, save_w1, False, "")
        a = out1[0]
        out2 = ops.quant_linear_fprop(a, w2, id2, key2, backend_name, x.dtype, save_x2, save_w2, False, "squared_relu")
        x1_saved, w1_saved = ops.fprop_saved(x, out1, save_x1, n_w1)
        x2_saved, w2_saved = ops.fprop_saved(a, out2, save_x2, n_w2)
        ctx.save_for_backward(w1, w2, a if save_w2 else None, *x1_saved, *w1_saved, *x2_saved, *w2_saved)
        ctx.counts = (len(x1_saved), len(w1_saved), len(x2_saved))
        ctx.args = (layer_ids, recipe_keys, backend_name, x.dtype, plan[2:])
        return out2[0]

    @staticmethod
    def backward(ctx, dy):
        w1, w2, a, *saved = ctx.saved_tensors
        n_x1, n_w1, n_x2 = ctx.counts
        x1_saved, w1_saved = saved[:n_x1], saved[n_x1 : n_x1 + n_w1]
        x2_saved, w2_saved = saved[n_x1 + n_w1 : n_x1 + n_w1 + n_x2], saved[n_x1 + n_w1 + n_x2 :]
        (id1, id2), (key1, key2), backend_name, x_dtype, (dy_pair1, dy_pair2) = ctx.args
        needs_x, needs_w1, needs_w2 = ctx.needs_input_grad[:3]
        needs_dh = needs_x or needs_w1
        dx = dw1 = dw2 = dh = None
        no_grads = (None,) * 5

        # fc2, as ops._backward runs it; Dgrad gives dh, the gradient of relu(a)²
        dy_q = ops.quant_linear_dy(dy, id2, key2, backend_name, "", None) if needs_dh and needs_w2 and dy_pair2 else []
        if needs_dh:
            dh = ops.quant_linear_dgrad(dy, w2, w2_saved, id2, key2, backend_name, a.dtype, dy_q[:2])
        if needs_w2:
            dw2 = ops.quant_linear_wgrad(dy, x2_saved, id2, key2, backend_name, w2.shape[1], w2.dtype, dy_q[2:])
        if not needs_dh:
            return dx, dw1, dw2, *no_grads

        # fc1: its dY = squared_relu_grad(dh, a), applied by the quantizers that read dh and a
        if needs_x and needs_w1 and dy_pair1:
            dy_q = ops.quant_linear_dy(dh, id1, key1, backend_name, "squared_relu_grad", a)
            da = dh  # Dgrad and Wgrad given their quantized dY read only its shape and dtype
        else:
            dy_q, da = [], activation.squared_relu_grad(dh, a)
        if needs_x:
            dx = ops.quant_linear_dgrad(da, w1, w1_saved, id1, key1, backend_name, x_dtype, dy_q[:2])
        if needs_w1:
            dw1 = ops.quant_linear_wgrad(da, x1_saved, id1, key1, backend_name, w1.shape[1], w1.dtype, dy_q[2:])
        return dx, dw1, dw2, *no_grads
