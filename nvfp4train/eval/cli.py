"""Hydra-style `key=value` arguments for the eval and export commands, with one-line errors.

The config is composed from `configs/<name>.yaml` with Hydra's compose API (the same override syntax
as training), without Hydra's output directories: these commands write only what they document.
"""
from __future__ import annotations

import re

from nvfp4train.eval.weights import RunError
from nvfp4train.train.config import CONFIG_DIR  # configs/ of the checkout, or the copy a wheel carries


def help_requested(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)


def usage(name: str, doc: str) -> str:
    """`--help` of `python -m nvfp4train.<name>`: its usage line, what it does (the module docstring
    after its first line) and its options, read from configs/<name>.yaml (defaults and comments)."""
    lines = (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()
    command = re.match(r"#\s*`([^`]+)`:?\s*(.*)", lines[0])
    out = [f"usage: {command.group(1) if command else f'python -m nvfp4train.{name} key=value ...'}", ""]
    if command and command.group(2):
        out += [command.group(2)[0].upper() + command.group(2)[1:], ""]
    out += doc.strip().split("\n", 1)[1].strip().splitlines() if "\n" in doc.strip() else []
    out += ["", f"options (key=value; configs/{name}.yaml):"]
    for line in lines[1:]:
        m = re.match(r"([A-Za-z_]\w*):\s*(.*?)\s*(?:#\s*(.*))?$", line)
        if m:
            key, value, comment = m.groups()
            value = "(required)" if value == "???" else value
            out.append(f"  {key + '=' + value:<26} {comment or ''}".rstrip())
    return "\n".join(out)


def compose(name: str, argv: list[str]) -> dict:
    """`configs/<name>.yaml` with the overrides applied -> a plain dict; bad input raises RunError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            raise RunError(f"argument {arg!r}: expected key=value (see configs/{name}.yaml)")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        try:
            cfg = hydra_compose(name, overrides=argv)
        except (HydraException, OmegaConfBaseException) as e:
            allowed = ", ".join(OmegaConf.load(CONFIG_DIR / f"{name}.yaml").keys())
            m = re.search(r"Could not override '([^']+)'", str(e)) or re.search(r"Key '([^']+)' is not in", str(e))
            if m:
                raise RunError(f"{m.group(1)}: unknown key; allowed: {allowed}") from None
            raise RunError(" ".join(str(e).split())) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise RunError(f"{missing[0]}: required (e.g. {missing[0]}=runs/default)")
    return OmegaConf.to_container(cfg, resolve=True)


def pick_device(setting: str) -> str:
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting not in ("cpu", "cuda"):
        raise RunError(f"device={setting!r}: allowed: auto, cpu, cuda")
    if setting == "cuda" and not torch.cuda.is_available():
        raise RunError("device=cuda: no CUDA device on this machine")
    return setting


def optional_int(key: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RunError(f"{key}={value!r}: expected a non-negative integer or null")
    return value
