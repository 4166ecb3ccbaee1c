"""`python -m nvfp4train.train [group=option ...] [key=value ...]`: pretrain from Hydra configs.

Also works under `torchrun --nproc_per_node=N -m nvfp4train.train ...` and SLURM's `srun`, and with
Hydra's own flags (`--cfg job`, `-m` sweeps). A bad key or value ends with one line naming it and
what is allowed, and exit code 2, before anything is written.
"""
from __future__ import annotations

import logging
import os
import re
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from nvfp4train.train.config import CONFIG_DIR, ConfigError, RunConfig


def explain_override_error(overrides: list[str]) -> str | None:
    """Compose the config as Hydra will; return a one-line explanation if that fails."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        try:
            compose("train", overrides=overrides)
            return None
        except (HydraException, OmegaConfBaseException) as e:
            text = str(e)
            defaults = compose("train")
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", text)
    if m:
        key = m.group(1)
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(defaults, parent) if parent else defaults
        if isinstance(node, DictConfig) and leaf not in node:
            return f"{key}: unknown key; allowed: {', '.join(str(k) for k in node.keys())}"
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if m:
        group, option = m.groups()
        options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        return f"{group}={option}: no such {group} config; allowed: {', '.join(options)}"
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _main(cfg: DictConfig) -> None:
    if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != 0:
        logging.getLogger().setLevel(logging.WARNING)  # one copy of the start-up log lines, from rank 0
    from nvfp4train.train.checkpoint import CheckpointError
    from nvfp4train.train.guards import TrainingHalted
    from nvfp4train.train.loop import run

    try:
        run_cfg = RunConfig.from_omegaconf(cfg)
        summary = run(run_cfg)
    except (ConfigError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except TrainingHalted as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(3)
    if summary["checkpoint"] and summary["rank"] == 0:
        print(f"done: step {summary['step']}, loss {summary['loss']:.4f}, checkpoint {summary['checkpoint']}")


def main() -> None:
    if not CONFIG_DIR.is_dir():
        sys.exit(f"error: config directory {CONFIG_DIR} not found (install nvfp4train with `pip install -e .` "
                 "from a clone of the repository)")
    overrides = [a for a in sys.argv[1:] if not a.startswith("-")]
    if "-m" not in sys.argv and "--multirun" not in sys.argv:
        problem = explain_override_error(overrides)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
    hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(_main)()
    from nvfp4train import dist
    dist.shutdown()  # once, after every run: the runs of a sweep share the process group


if __name__ == "__main__":
    main()
