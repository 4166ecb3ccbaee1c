"""One validator for every config section: the section's dataclass is its schema.

Each section (model, precision, data, optim, train and their sub-sections) is a dataclass. Its fields
hold the defaults, and the docstring under each field says what it means. A key that takes a fixed set
of values is a `StrEnum`; a number with a range gets its bounds from `bounded(...)`.

`parse(cls, mapping, "train")` builds a section from plain data (a YAML file, a Hydra node turned into
a dict) and rejects unknown and missing keys; each dataclass calls `check(self, "train")` in its
`__post_init__`, so a config built in Python is checked the same way. Every problem is a `ConfigError`
of one line that names the key and what is allowed:

    train: unknown key 'max_stepz' (train.max_stepz); allowed: max_steps, seq_len, ...
    model.d_model: expected int, got '128' (str)
    train.parallel='zero3': allowed ddp, fsdp2, hsdp, deepspeed
    train.max_steps=-3: must be a positive integer

Types are strict: a bool field takes true/false only, an int field integers only (not true/false). A float
field also takes a numeric string, because PyYAML reads `1e-5` (no dot) as a string, and must be finite.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad config key or value; the message names the key and what is allowed."""


def bounded(default, *, ge=None, gt=None, le=None, lt=None):
    """A field with a default whose value must lie within the given bounds (checked by `check`)."""
    bounds = {name: v for name, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, metadata=bounds)


def parse(cls: type[T], raw: Any, prefix: str, **fixed) -> T:
    """Build dataclass `cls` from a mapping; `fixed` are constructor arguments that are not config keys."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix}: must be a mapping of keys to values, got {raw!r} ({type(raw).__name__})")
    allowed = [name for name in fields_of(cls) if name not in fixed]
    for key in raw:
        if key not in allowed:
            raise unknown_key(prefix, key, allowed)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name in allowed and f.name not in raw:
            raise ConfigError(f"{_join(prefix, f.name)}: missing; it has no default")
    return cls(**{str(k): v for k, v in raw.items()}, **fixed)


def unknown_key(prefix: str, key, allowed) -> ConfigError:
    """The one message for a key that a section does not have."""
    where = f"{prefix}: unknown key {key!r} ({prefix}.{key})" if prefix else f"unknown key {key!r}"
    return ConfigError(f"{where}; allowed: {', '.join(allowed)}")


def check(obj, prefix: str) -> None:
    """Check (and normalize: numeric strings to float, lists to tuples, mappings to dataclasses, strings to
    enums) every field of dataclass instance `obj` in place."""
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        path = _join(prefix, f.name)
        value = _coerce(path, getattr(obj, f.name), hints[f.name])
        _check_bounds(path, value, f.metadata)
        object.__setattr__(obj, f.name, value)  # also for frozen dataclasses: this is their construction


def fields_of(tp) -> list[str] | None:
    """The keys a config node of type `tp` takes (None: any key, e.g. a dict of named sources)."""
    tp = _strip_optional(tp)
    if dataclasses.is_dataclass(tp):
        return [f.name for f in dataclasses.fields(tp) if f.init and f.metadata.get("config_key", True)]
    return None


def not_a_key():
    """A field the code that builds the dataclass fills in (e.g. a source's name), not a config key."""
    return dataclasses.field(metadata={"config_key": False})


def child_type(tp, key: str):
    """The type of key `key` inside a node of type `tp`, or None if `tp` has no such key."""
    tp = _strip_optional(tp)
    if dataclasses.is_dataclass(tp):
        return _type_hints(tp).get(key) if key in fields_of(tp) else None
    if typing.get_origin(tp) is dict:
        return typing.get_args(tp)[1]
    return Any


def to_plain(value):
    """Dataclasses, enums and tuples as plain dicts, strings and lists (for YAML, JSON and Hydra)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def defaults(cls) -> dict:
    """The fields of `cls` that have a default, with their defaults, as plain data."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = to_plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_plain(f.default_factory())
    return out


# ---------------------------------------------------------------------------------------------------------


def _join(prefix: str, key) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


@functools.cache
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _strip_optional(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


INT64_MAX = 2**63 - 1


def _expected(path, value, what: str):
    return ConfigError(f"{path}: expected {what}, got {value!r} ({type(value).__name__})")


def _coerce(path: str, value, tp):
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        inner = _strip_optional(tp)
        if inner is tp:
            raise TypeError(f"{path}: schema type {tp} is not supported")  # a bug in the schema, not the config
        return _coerce(path, value, inner)
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        if isinstance(value, str) and value in tp._value2member_map_:
            return tp(value)
        raise ConfigError(f"{path}={value!r}: allowed {', '.join(m.value for m in tp)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return parse(tp, value, path)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise _expected(path, value, "a list")
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        elif len(value) != len(args):
            raise ConfigError(f"{path}={list(value)!r}: expected a list of {len(args)} values")
        return tuple(_coerce(f"{path}[{i}]", v, t) for i, (v, t) in enumerate(zip(value, args)))
    if origin is dict:
        value_type = typing.get_args(tp)[1]
        if not isinstance(value, Mapping):
            raise _expected(path, value, "a mapping")
        return {str(k): _coerce(f"{path}.{k}", v, value_type) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _expected(path, value, "bool (true or false)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT64_MAX - 1 <= value <= INT64_MAX:  # torch, numpy and the checkpoints hold ints as int64
                raise ConfigError(f"{path}={value}: too large; an integer key holds at most 2**63-1 = {INT64_MAX}")
            return value
        raise _expected(path, value, "int")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # PyYAML reads "1e-5" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise _expected(path, value, "float")
        if not math.isfinite(number):  # no config value means inf or nan (optim.lr=inf trains to NaN)
            raise ConfigError(f"{path}={value}: must be a finite number")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise _expected(path, value, "str")
    if tp is Path:
        if isinstance(value, (str, Path)) and str(value):
            return Path(value)
        raise _expected(path, value, "a path")
    raise TypeError(f"{path}: schema type {tp} is not supported")


def _check_bounds(path: str, value, metadata: Mapping) -> None:
    bounds = {k: v for k, v in metadata.items() if k in ("ge", "gt", "le", "lt")}
    if value is None or not bounds:
        return
    ge, gt, le, lt = (bounds.get(k) for k in ("ge", "gt", "le", "lt"))
    if (
        (ge is not None and not value >= ge)
        or (gt is not None and not value > gt)
        or (le is not None and not value <= le)
        or (lt is not None and not value < lt)
    ):
        if isinstance(value, int) and ge == 1 and len(bounds) == 1:
            rule = "must be a positive integer"
        elif isinstance(value, int) and ge == 0 and len(bounds) == 1:
            rule = "must be an integer >= 0"
        elif len(bounds) == 2 and (ge, gt).count(None) == 1 and (le, lt).count(None) == 1:
            low, high = ("[", ge) if ge is not None else ("(", gt), ("]", le) if le is not None else (")", lt)
            rule = f"must be in {low[0]}{low[1]}, {high[1]}{high[0]}"
        else:
            rule = "must be " + " and ".join(
                f"{op} {bounds[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if k in bounds
            )
        raise ConfigError(f"{path}={value!r}: {rule}")
