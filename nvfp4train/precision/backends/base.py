"""What every GEMM backend object is (the package docstring lists them)."""

from __future__ import annotations

from ..recipe import PrecisionPolicy


class Backend:
    """`name`; `native_gemm`: whether its GEMMs run at the operand format's own tensor-core rate
    (False: BF16 GEMMs on dequantized operands); `unsupported(policy)`: why it cannot run
    `policy` here (None: it can)."""

    name: str
    native_gemm: bool

    def unsupported(self, policy: PrecisionPolicy) -> str | None:
        raise NotImplementedError
