"""`--help` of the commands that take `key=value` arguments (eval, export, generate, summary): the options of
configs/<name>.yaml with their defaults, comments and choices."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from enum import StrEnum

from nvfp4train.config.commands import GROUPS
from nvfp4train.config.composition import CONFIG_DIR, command_schema, group_options
from nvfp4train.config.schema import child_type, defaults


def help_requested(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)


def usage(name: str, doc: str) -> str:
    """`--help` of `python -m nvfp4train.<name>` (not train's, which has its own): the usage line and what the
    command does (configs/<name>.yaml's first line), the module docstring after its first paragraph, then the
    options: the config groups and keys of configs/<name>.yaml with their defaults and comments, and the
    choices of every key that takes a fixed set of values (from the dataclass)."""
    schema = command_schema(name)
    lines = (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()
    command = re.match(r"#\s*`([^`]+)`:?\s*(.*)", lines[0])
    out = [f"usage: {command.group(1) if command else f'python -m nvfp4train.{name} key=value ...'}", ""]
    if command and command.group(2):
        out += [command.group(2)[0].upper() + command.group(2)[1:], ""]
    # the docstring's first paragraph is its own usage line, which the YAML's repeats
    out += doc.strip().split("\n\n", 1)[1].strip("\n").splitlines() if "\n\n" in doc.strip() else []
    out += ["", f"options (key=value; configs/{name}.yaml):"]
    hints = {f.name: f.type for f in dataclasses.fields(schema)}
    for line in lines[1:]:
        group = re.match(r"\s+-\s+([A-Za-z_]\w*):\s*(\S+)\s*(?:#\s*(.*))?$", line)
        key = re.match(r"([A-Za-z_]\w*):\s*(.*?)\s*(?:#\s*(.*))?$", line)
        if group and group.group(1) in GROUPS.get(name, ()):
            g, default, comment = group.groups()
            options = ", ".join(o for o in group_options(g) if not o.startswith("_"))
            text = f"{comment + '; ' if comment else ''}one of: {options}"
            out += textwrap.wrap(text, 110, initial_indent=f"  {g + '=' + default:<26} ", subsequent_indent=" " * 29)
            out.append(f"  {g + '.KEY=VALUE':<26} one field of the {g} config")
        elif key and key.group(1) in hints:
            k, value, comment = key.groups()
            value = "(required)" if value == "???" else value
            choices = _choices(schema, k)
            if choices and not (comment and all(c in comment for c in choices)):
                comment = f"{comment + '; ' if comment else ''}{' | '.join(choices)}"
            out.append(f"  {k + '=' + value:<26} {comment or ''}".rstrip())
    for f in dataclasses.fields(schema):  # a section of its own keys that the YAML does not spell out
        if f.name not in GROUPS.get(name, ()) and dataclasses.is_dataclass(section := child_type(schema, f.name)):
            out += [f"  {f.name}.{k}={v}" for k, v in defaults(section).items()]
    return "\n".join(out)


def _choices(schema, key: str) -> list[str]:
    tp = child_type(schema, key)
    return [m.value for m in tp] if isinstance(tp, type) and issubclass(tp, StrEnum) else []
