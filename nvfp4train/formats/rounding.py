"""Random streams for stochastic rounding.

Every stochastic-rounding function in this package takes ``generator``: a ``torch.Generator``
on the same device as the tensor being quantized (``None`` uses torch's default generator for
that device). Reproducibility and independence are the caller's business, made easy here:

* one generator per tensor role gives independent streams, e.g.
  ``sr_generator(seed, stream_id=layer_index * 4 + role, device=x.device)``;
* re-creating a generator from the same ``(seed, stream_id)`` replays the same draws.

``stream_id`` is mixed with ``seed`` through SplitMix64, so neighbouring ids give unrelated
seeds (Philox on CUDA and Mersenne Twister on CPU both decorrelate distinct seeds).
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    """One SplitMix64 step: a bijective 64-bit mixer (Steele et al. 2014)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stream_seed(seed: int, stream_id: int) -> int:
    """A 63-bit seed for stream ``stream_id`` of run seed ``seed`` (both non-negative ints)."""
    if seed < 0 or stream_id < 0:
        raise ValueError(f"seed and stream_id must be non-negative ints, got {seed}, {stream_id}")
    return _splitmix64(_splitmix64(seed) ^ stream_id) >> 1


def sr_generator(seed: int, stream_id: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` for stream ``stream_id`` of run seed ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(stream_seed(seed, stream_id))
    return gen


def _check_generator_device(x: torch.Tensor, generator: torch.Generator | None) -> None:
    if generator is not None and generator.device.type != x.device.type:
        raise ValueError(
            f"generator is on device '{generator.device}' but the tensor is on '{x.device}': "
            "stochastic rounding draws on the tensor's device; pass a generator created there "
            "(e.g. sr_generator(seed, stream_id, device=x.device))"
        )


def random_bits_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Uniform random int32 words (all 32 bits random), one per element of ``x``, on x's device.

    Drawn as full-range int64 words, two elements per draw: on CPU this is ~4x cheaper than
    ``torch.rand`` (which spends one 32-bit Mersenne Twister draw per float and converts it).
    """
    _check_generator_device(x, generator)
    n = x.numel()
    words = torch.empty((n + 1) // 2, dtype=torch.int64, device=x.device)
    words.random_(-(2**63), None, generator=generator)  # from int64 min, no upper bound: all 64 bits
    return words.view(torch.int32)[:n].view(x.shape)
