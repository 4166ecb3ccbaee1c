"""`python -m nvfp4train.train [group=option ...] [key=value ...]`: pretrain from Hydra configs.

Also works under `torchrun --nproc_per_node=N -m nvfp4train.train ...` and SLURM's `srun`, and with
Hydra's own flags (`--cfg job`, `-m` sweeps). A bad key or value ends with one line naming it and
what is allowed, and exit code 2, before anything is written: the overrides are checked against the
config dataclasses (and, for one run, composed) before Hydra runs the job.
"""
from __future__ import annotations

import logging
import os
import sys

from nvfp4train.train.stop import StopSignal, StoppedBeforeFirstStep

if __name__ == "__main__":
    StopSignal.install()  # first, before the imports below take their seconds: see train/stop.py


# The imports below (torch, Hydra) take seconds, so they happen inside main(), after the stop handler.
def _main(cfg) -> None:
    if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != 0:
        logging.getLogger().setLevel(logging.WARNING)  # one copy of the start-up log lines, from rank 0
    from nvfp4train.dist.errors import fail
    from nvfp4train.train.checkpoint import CheckpointError
    from nvfp4train.train.config import ConfigError, RunConfig
    from nvfp4train.train.guards import TrainingHalted
    from nvfp4train.train.loop import run

    try:
        run_cfg = RunConfig.from_omegaconf(cfg)
        summary = run(run_cfg)
    except (ConfigError, CheckpointError) as e:
        fail(str(e), 2)  # one line from rank 0 (and in torchrun's error file): dist/errors.py
    except TrainingHalted as e:
        fail(str(e), 3)
    if summary.get("note"):
        if summary["rank"] == 0:
            print(summary["note"])
    elif summary["checkpoint"] and summary["rank"] == 0:
        print(f"done: step {summary['step']}, loss {summary['loss']:.4f}, checkpoint {summary['checkpoint']}")


def main() -> None:
    try:
        _cli()
    except StoppedBeforeFirstStep as e:  # SIGTERM / SIGUSR1 / Ctrl-C while starting: a clean stop
        # torchrun stops the other ranks of a failed job this way: say it once. (No import here: the signal
        # may have interrupted torch's import, and importing it again would crash.)
        if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) in ("0", ""):
            print(str(e), file=sys.stderr)
        sys.exit(0)


def _cli() -> None:
    import hydra
    from hydra._internal.utils import get_args_parser  # Hydra's own command line (its flags and overrides)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from nvfp4train.dist.errors import fail
    from nvfp4train.train.config import CONFIG_DIR, ConfigError, check_overrides, compose, register_defaults

    args = get_args_parser().parse_args()
    try:
        check_overrides(args.overrides)
        if not args.multirun:  # one job: compose it here so that what Hydra would reject is one line too
            compose(args.overrides)
    except ConfigError as e:
        fail(str(e), 2)  # under torchrun: every rank refuses alike, before any process group; rank 0 says it
    except (HydraException, OmegaConfBaseException) as e:
        fail(str(e), 2)
    register_defaults()
    hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(_main)()
    from nvfp4train import dist
    dist.shutdown()  # once, after every run: the runs of a sweep share the process group


if __name__ == "__main__":
    main()
