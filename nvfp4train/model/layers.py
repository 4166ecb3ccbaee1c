"""The layer factory: how the model asks for the layers whose numerics are not its business.

Every linear of a block comes from `factory.linear(...)`, and a block's MLP from `factory.mlp(...)` where the
factory has one of its own (None: the model builds `blocks.MLP` from two `linear`s). The model owns this protocol
and the names it gives its linears; `nvfp4train.precision.build_linear_factory` implements it with quantized
layers, `PLAIN_LAYERS` with `nn.Linear` (a model built without a precision policy). So the model never names a
number format, and nothing in it asks what class a layer is.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn

# The names the model gives the linears it asks the factory for (`factory.linear(..., name=...)`), listed once:
# a factory may refuse others, and a precision layer's SR streams are numbered by its name's place here (so the
# order is part of the random streams a seed gives: append, never reorder).
LINEAR_NAMES = ("in_proj", "out_proj", "qkv", "out", "fc1", "fc2")
OUTPUT_LINEARS = ("out_proj", "out", "fc2")  # write into the residual stream: scaled init


@runtime_checkable
class LayerFactory(Protocol):
    """What the model asks for its blocks' layers; `block_index` is the block's place in the pattern."""

    def linear(
        self, in_features: int, out_features: int, *, block_index: int, name: str, strided_output: bool = False
    ) -> nn.Module:
        """A bias-free linear, y = x @ weight.T, with an [out_features, in_features] `weight` (the model
        initializes it). `name` is one of LINEAR_NAMES. `strided_output`: the caller reads the output only
        through views along features (a split), so the layer may return the first out_features columns of a
        wider row-major buffer instead of a contiguous tensor."""
        ...

    def mlp(self, in_features: int, hidden_features: int, *, block_index: int) -> nn.Module | None:
        """The block's MLP, fc2(relu(fc1(x))²), as the factory's own module (children `fc1` and `fc2` from
        `linear`, so the model initializes them and names them in the state dict as its own MLP's), or None: the
        model builds its own from two `linear`s."""
        ...


class PlainLayers:
    """The factory of a model without a precision policy: `nn.Linear` without bias, and the model's own MLP."""

    def linear(
        self, in_features: int, out_features: int, *, block_index: int, name: str, strided_output: bool = False
    ) -> nn.Module:
        return nn.Linear(in_features, out_features, bias=False)  # contiguous output: allowed under strided_output

    def mlp(self, in_features: int, hidden_features: int, *, block_index: int) -> nn.Module | None:
        return None

    def __repr__(self) -> str:
        return "PlainLayers()"


PLAIN_LAYERS = PlainLayers()
