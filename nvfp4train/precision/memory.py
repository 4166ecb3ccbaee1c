"""How many bytes a layer keeps alive between forward and backward (its saved activations).

Measured, not estimated: every tensor autograd saves during the forward passes through a
`saved_tensors_hooks` pack hook; parameters (which live anyway) are not counted, and a storage
seen twice is counted once.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear import QuantLinear


def saved_activation_bytes(
    module: nn.Module, x: torch.Tensor, autocast_dtype: torch.dtype | None = torch.bfloat16
) -> int:
    """Bytes of the non-parameter tensors autograd saves for backward in `module(x)`."""
    param_storages = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_storages:
            seen[ptr] = storage.nbytes()
        return t

    x = x.detach().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if autocast_dtype is not None:
            with torch.autocast(x.device.type, dtype=autocast_dtype):
                module(x)
        else:
            module(x)
    # The layer input itself is alive anyway in a network only if something else keeps it; count it
    # like any other saved tensor (nn.Linear saves it; the quantized layer saves a packed copy instead).
    return sum(seen.values())


def saved_bytes_report(policy, in_features: int, out_features: int, tokens: int, device="cpu") -> dict[str, float]:
    """Saved-activation bytes of one quantized linear of `policy` vs nn.Linear in BF16 autocast."""
    n_blocks = 1
    layer = QuantLinear(
        in_features, out_features, policy=policy, block_index=0, n_blocks=n_blocks, name="fc1", seed=0, device=device
    )
    reference = nn.Linear(in_features, out_features, bias=False, device=device)
    x = torch.randn(tokens, in_features, device=device)
    quant = saved_activation_bytes(layer, x)
    bf16 = saved_activation_bytes(reference, x)
    return {"quantized_bytes": quant, "bf16_bytes": bf16, "ratio": quant / bf16}
