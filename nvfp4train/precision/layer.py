"""What every linear the precision factory builds shares (`QuantLinear`, `backends.TELinear`): the GEMM's shape,
the (block, name) it was asked for, an FP32 [out, in] master weight initialised as nn.Linear initialises it,
and the layer's random constants as buffers, so a model's parameters, their init and its state dict are the
same on every backend (a checkpoint carries over between them)."""

from __future__ import annotations

import math

import torch
from torch import nn

from nvfp4train.formats import hadamard, rounding
from nvfp4train.model.layers import LINEAR_NAMES

from .recipe import ROLES, PrecisionPolicy

# The buffers a layer's config (seed, block, name, precision) determines: a state dict without them (a checkpoint
# written before they were stored) or with another RHT size loads, the layer keeping its own values.
CONFIG_DERIVED_BUFFERS = ("sr_seeds", "rht_signs")


class PrecisionLinear(nn.Module):
    """y = x @ weight.T for linear `name` of block `block_index` of `n_blocks`, numerics from `policy`
    (a subclass decides how). `label` ("block3.fc1") names the layer in telemetry and checkpoints.

    Buffers: `sr_seeds` (int64, one stochastic-rounding stream seed per operand role, from `seed`, the block
    and the name) and `rht_signs` (the ±1 Hadamard sign vector of the policy's RHT size; `rht_signs`: None
    gives hadamard's default vector, an int seeds a random one). They travel in the state dict, so a
    checkpoint records the streams and signs the run used, and a loaded value is the one the layer uses.
    `sr_seed_values` / `rht_sign_values` are their host copies."""

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
        seed: int = 0,
        rht_signs=None,
        strided_output: bool = False,
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
        # Whether the caller reads the output only through views along features (e.g. a split, as a Mamba
        # in_proj's is), so it may be the first out_features columns of a wider row-major buffer: a GEMM that
        # pads N (blockwise FP8 on scaled_mm: W's 128-row tiles) then returns its output without the copy that
        # would crop it. False: a contiguous output, as nn.Linear's. The model asks for it (LayerFactory.linear).
        self.strided_output = bool(strided_output)
        # Each (block, name) draws its own SR streams: 8 stream ids per name, 8 names per block (a name outside
        # LINEAR_NAMES, e.g. a test's, takes slot 7), one per operand role.
        name_id = LINEAR_NAMES.index(name) if name in LINEAR_NAMES else 7
        stream_base = (block_index * 8 + name_id) * 8
        self.sr_seed_values = [rounding.stream_seed(seed, stream_base + i) for i in range(len(ROLES))]
        with torch.device("cpu"):  # host values, whatever default device the model is built under (meta: counted)
            self.rht_sign_values = tuple(hadamard.resolve_signs(policy.resolved_rht_dim, rht_signs).tolist())
        self.register_buffer("sr_seeds", torch.tensor(self.sr_seed_values, dtype=torch.int64, device=device))
        self.register_buffer("rht_signs", torch.tensor(self.rht_sign_values, dtype=torch.float32, device=device))

    def constants_loaded(self) -> None:
        """The seed and sign buffers were loaded: refresh their host copies (a subclass, what uses them)."""
        self.sr_seed_values = self.sr_seeds.tolist()
        self.rht_sign_values = tuple(self.rht_signs.float().tolist())

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        """As nn.Module's, except for CONFIG_DERIVED_BUFFERS: one the state dict lacks (written before they were
        stored) or holds in another shape (another RHT size: the precision changed) keeps the value this layer
        was built with, which the run's seed and precision config alone determine (the values the writing run
        used, where its config is this one)."""
        ours = {prefix + name: getattr(self, name) for name in CONFIG_DERIVED_BUFFERS}
        mismatched = [k for k, v in ours.items() if k in state_dict and state_dict[k].shape != v.shape]
        if mismatched:
            state_dict = {k: v for k, v in state_dict.items() if k not in mismatched}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)
        missing[:] = [k for k in missing if k not in ours]
        self.constants_loaded()
