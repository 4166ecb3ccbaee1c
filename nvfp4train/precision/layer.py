"""What every linear the precision factory builds shares (`QuantLinear`, `te.TELinear`): the GEMM's shape, the
(block, name) it was asked for, and an FP32 [out, in] master weight initialised as nn.Linear initialises it,
so a model's parameters, their init and its state dict are the same on every backend."""

from __future__ import annotations

import math

import torch
from torch import nn

from .recipe import PrecisionPolicy


class PrecisionLinear(nn.Module):
    """y = x @ weight.T for linear `name` of block `block_index` of `n_blocks`, numerics from `policy`
    (a subclass decides how). `label` ("block3.fc1") names the layer in telemetry and checkpoints."""

    backend_name: str

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        policy: PrecisionPolicy,
        block_index: int,
        n_blocks: int,
        name: str,
        device=None,
        dtype=torch.float32,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.block_index, self.n_blocks, self.name = block_index, n_blocks, name
        self.label = f"block{block_index}.{name}"
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default; models re-init
        self.switched = False
