"""A package's names loaded from their modules on first use (PEP 562), so that importing the package (and
its light modules, such as the configs every command reads) does not import torch or the kernels."""

from __future__ import annotations

import importlib
import sys


def lazy_names(package: str, table: dict[str, str]):
    """The module `__getattr__` of `package`: `table` maps each name to the submodule that defines it; the
    value is kept in the package once loaded."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
