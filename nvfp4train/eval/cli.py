"""Hydra-style `key=value` arguments for the eval and export commands, with one-line errors.

The config is composed from `configs/<name>.yaml` with Hydra's compose API (the same override syntax
as training), without Hydra's output directories: these commands write only what they document.
"""
from __future__ import annotations

import re

from nvfp4train.eval.weights import RunError
from nvfp4train.train.config import CONFIG_DIR  # configs/ of the checkout, or the copy a wheel carries


def compose(name: str, argv: list[str]) -> dict:
    """`configs/<name>.yaml` with the overrides applied -> a plain dict; bad input raises RunError."""
    from hydra import compose as hydra_compose, initialize_config_dir
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
