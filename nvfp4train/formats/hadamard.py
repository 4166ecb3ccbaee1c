"""Random Hadamard transform (RHT) along the last dimension, in blocks of d.

    rht_matrix(d) = diag(signs) @ H_d / sqrt(d)

H_d is the Sylvester Hadamard matrix (entries ±1); ``diag(signs)`` flips its rows (the sign
matrix multiplies from the left, as in the paper App. C and TE). The matrix is orthogonal, and
``rht(x)`` is ``x.reshape(-1, d) @ rht_matrix(d)``, so applying it to both operands of a GEMM
along their contraction dim leaves the product unchanged (``M @ M.T = I``).

Signs:
* ``None`` and d = 16: TE's fixed vector ``WGRAD_SIGNS_16`` (also torchao's default);
* ``None`` and any other d: ``random_signs(d, DEFAULT_SIGN_SEED)``;
* an int: ``random_signs(d, seed)``;
* a tensor of ±1 of length d.

Arithmetic (one definition for every device and for the Triton kernel in kernels/):

    y_j = round_to_x.dtype( (..((x_0 m_0j + x_1 m_1j) + x_2 m_2j) + ..) + x_{d-1} m_{d-1,j} )

with m = ``rht_matrix(d, signs)`` in FP32, each product rounded to FP32 and the d products
summed in FP32 in index order, then rounded once more to x's dtype (TE's reference also returns
x's dtype, so for bf16 inputs the quantizer sees bf16 values). For d = 16 and bf16/fp16/fp32
inputs the products are exact (x * ±1/4), so only the additions round: FP32 accumulation, as TE's
hardware path accumulates its BF16 x BF16 MMA in FP32. (The tensor core's internal summation order
is not specified, so TE's kernel can still differ in the last bit where a 16-block spans more than
2^24 in magnitude.) float64 inputs are summed the same way in float64.

Until 2026-11 bf16/fp16 inputs were transformed exactly in float64 and rounded once; that differs
from this rule only where a block's FP32 partial sums round and the bf16 rounding then falls the
other way (34 of 983,040 elements of a 3840x256 bf16 tensor of randn * 2^U(-20, 20); none of the
golden vectors, tests/formats/test_golden.py, which pass under both rules).
"""

from __future__ import annotations

import functools
import math

import torch

from .impl import use_triton

WGRAD_SIGNS_16 = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
DEFAULT_SIGN_SEED = 0


def random_signs(d: int, seed: int = DEFAULT_SIGN_SEED) -> torch.Tensor:
    """A ±1 float32 vector of length d from a CPU ``torch.Generator`` seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (d,), generator=gen)
    return (1 - 2 * bits).to(torch.float32)


def _check_d(d: int) -> None:
    if not isinstance(d, int) or d < 1 or d & (d - 1):
        raise ValueError(f"hadamard: d={d!r} must be a positive power of two (16 for NVFP4, 32 for MXFP4)")


def resolve_signs(d: int, signs=None) -> torch.Tensor:
    """The ±1 sign vector (float32, CPU) that ``signs`` stands for (see module docstring). None, an int seed
    or a tuple (a layer's host copy of its signs) resolve once per value: the quantizers ask for every Wgrad
    operand, and building and checking the vector each time is host time a training step waits on. The
    vector returned is shared: read it, do not write it."""
    if signs is None or isinstance(signs, (int, tuple)) and not isinstance(signs, bool):
        return _resolve_signs_once(d, signs)
    return _resolve_signs(d, signs)


@functools.lru_cache(maxsize=64)
def _resolve_signs_once(d: int, signs) -> torch.Tensor:
    return _resolve_signs(d, signs)


def _resolve_signs(d: int, signs) -> torch.Tensor:
    _check_d(d)
    if signs is None:
        return torch.tensor(WGRAD_SIGNS_16, dtype=torch.float32) if d == 16 else random_signs(d)
    if isinstance(signs, int) and not isinstance(signs, bool):
        return random_signs(d, signs)
    signs = torch.as_tensor(signs, dtype=torch.float32).cpu()
    if signs.shape != (d,) or not bool(((signs == 1) | (signs == -1)).all()):
        raise ValueError(f"hadamard: signs must be None, an int seed or {d} values of ±1, got {signs.tolist()}")
    return signs


def sylvester(d: int) -> torch.Tensor:
    """The d x d Sylvester Hadamard matrix with ±1 entries (float32)."""
    _check_d(d)
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def rht_matrix(d: int = 16, signs=None, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """``diag(signs) @ H_d / sqrt(d)`` in ``dtype`` (exact for d = 16 in any float dtype)."""
    h = resolve_signs(d, signs).unsqueeze(1) * sylvester(d)
    return (h.double() / math.sqrt(d)).to(dtype=dtype, device=device)


def _signs_key(d: int, signs):
    """A hashable stand-in for ``signs`` (None and ints as they are, a tensor as its tuple)."""
    if signs is None or (isinstance(signs, int) and not isinstance(signs, bool)):
        return signs
    return tuple(resolve_signs(d, signs).tolist())


@functools.lru_cache(maxsize=64)
def _cached_matrix(d: int, signs_key, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``rht_matrix`` built once per (signs, dtype, device): a training step calls ``rht`` for every
    Wgrad operand, and building the matrix on the host and copying it over each time blocks the step."""
    signs = torch.tensor(signs_key, dtype=torch.float32) if isinstance(signs_key, tuple) else signs_key
    return rht_matrix(d, signs, dtype=dtype, device=device)


def check_wgrad_input(x: torch.Tensor, d: int, who: str) -> None:
    """The input of a fused Wgrad quantizer (RHT along tokens, then d-element blocks): a 2-D
    [tokens, features] float tensor whose token count is a multiple of d; one-line errors otherwise."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes:
        raise TypeError(f"{who}: x must be a torch.Tensor of {dtypes}, got {getattr(x, 'dtype', type(x))}")
    if x.ndim != 2 or x.shape[0] % d != 0 or x.numel() == 0:
        raise ValueError(
            f"{who}: x must be 2-D [tokens, features] with tokens a multiple of {d}, got shape {tuple(x.shape)}"
        )


KERNEL_DIMS = (16, 32)  # the d of the Triton kernel (kernels.rht.rows): NVFP4's and MXFP4's blocks
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rht(x: torch.Tensor, d: int = 16, signs=None, impl: str = "auto") -> torch.Tensor:
    """Transform ``x`` along its last dim in blocks of d; same shape and dtype as x (the sum
    order and roundings are in the module docstring). impl: "reference" (the PyTorch loop below),
    "triton" (kernels.rht.rows, one pass, the same bits; d 16 or 32, float32/bfloat16/float16) or
    "auto" (see impl.py)."""
    _check_d(d)
    if not x.is_floating_point():
        raise TypeError(f"hadamard.rht: x must be a floating tensor, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % d != 0:
        raise ValueError(f"hadamard.rht: the last dim of shape {tuple(x.shape)} must be a multiple of d={d}")
    kernel_fits = d in KERNEL_DIMS and x.dtype in KERNEL_DTYPES and x.numel() > 0
    if impl == "triton" and not kernel_fits:
        raise ValueError(
            f"hadamard.rht: impl='triton' takes d in {KERNEL_DIMS} and {KERNEL_DTYPES}, got d={d}, {x.dtype}, "
            f"shape {tuple(x.shape)}; use impl='reference'"
        )
    # "auto" leaves what the kernel does not take to the loop below; use_triton refuses an unknown impl
    if (kernel_fits or impl != "auto") and use_triton(x, impl, "hadamard.rht"):
        from . import kernels

        return kernels.rht.rows(x, d, resolve_signs(d, signs))
    compute_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    matrix = _cached_matrix(d, _signs_key(d, signs), compute_dtype, x.device)
    blocks = x.reshape(-1, d).to(compute_dtype)
    # Row i of the matrix scaled by element i of each block, accumulated in index order: separate
    # multiply and add (no FMA; for d = 16 the products are exact, so an FMA would agree anyway).
    y = blocks[:, :1] * matrix[0]
    for i in range(1, d):
        y = y + blocks[:, i : i + 1] * matrix[i]
    return y.to(x.dtype).reshape(x.shape)
