"""What torch.compile is told about some of the model's functions, without importing torch.compile's machinery.

`torch.compiler.assume_constant_result` imports `torch._dynamo` (and through it sympy, triton and
torch.distributed's FSDP), a large import that `--help` and the model's own import do not need. The mark itself
is one function attribute, which dynamo reads when it traces a call; `assume_constant_result` here sets that
attribute as torch's does (tests/model/test_marks.py compares the two), so the model's modules import without
dynamo.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def assume_constant_result(fn: F) -> F:
    """`torch.compiler.assume_constant_result(fn)`: compiled code calls fn once, while tracing, and uses its
    result as a constant."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]  # torch._dynamo.decorators' attribute
    return fn
