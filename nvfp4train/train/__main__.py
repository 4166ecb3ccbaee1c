"""`python -m nvfp4train.train [group=option ...] [key=value ...]`: pretrain from Hydra configs.

Also works under `torchrun --standalone --nproc_per_node=N -m nvfp4train.train ...` and SLURM's `srun`, and with
Hydra's own flags (`--cfg job`, `-m` sweeps). A bad key or value ends with one line naming it and
what is allowed, and exit code 2, before anything is written: the overrides are checked against the
config dataclasses (and, for one run, composed) before Hydra runs the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from nvfp4train.train.stop import StoppedBeforeFirstStep, StopSignal

if __name__ == "__main__":
    StopSignal.install()  # first, before the imports below take their seconds: see train/stop.py


# The imports below (torch, Hydra) take seconds, so they happen inside main(), after the stop handler.
def _main(cfg) -> None:
    if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != 0:
        logging.getLogger().setLevel(logging.WARNING)  # one copy of the start-up log lines, from rank 0
    from nvfp4train.config import ConfigError, RunConfig
    from nvfp4train.launch.errors import fail
    from nvfp4train.train import final_eval
    from nvfp4train.train.checkpoint import CheckpointError
    from nvfp4train.train.guards import TrainingHalted
    from nvfp4train.train.loop import run
    from nvfp4train.train.sweep import place_sweep_job

    placed = place_sweep_job(cfg)  # a `-m` sweep's job trains in a directory of its own: train/sweep.py
    if placed and int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0:
        print(placed, flush=True)
    try:
        run_cfg = RunConfig.from_omegaconf(cfg)
        final_eval.check(run_cfg)
        summary = run(run_cfg)
    except (ConfigError, CheckpointError) as e:
        _end_process_group()
        fail(str(e), 2)  # one line from rank 0 (and in torchrun's error file): launch/errors.py
    except TrainingHalted as e:
        _end_process_group()
        fail(str(e), 3)
    if summary.get("note") and summary["rank"] == 0:
        print(summary["note"])
    if summary.get("exit_code"):  # Ctrl-C: 130, so that `train && eval` stops (loop.py printed the line)
        sys.exit(summary["exit_code"])
    at_end = summary["step"] == run_cfg.train.max_steps
    if run_cfg.train.final_eval.enabled and at_end and not (summary.get("note") and final_eval.is_done(run_cfg)):
        from nvfp4train.eval.weights import RunError

        try:
            final_eval.evaluate_final(run_cfg)
        except (ConfigError, RunError) as e:  # training is done and its checkpoint saved: only the evaluation failed
            fail(f"train.final_eval: {e} (the run is trained: python -m nvfp4train.eval run_dir={run_cfg.out_dir})", 2)


def _end_process_group() -> None:
    """Before a refusal's exit: the process group's C++ threads are ended here, not left to the interpreter's
    shutdown, where destroying a still-running one aborted a rank ("terminate called without an active
    exception", SIGABRT instead of the refusal's exit code)."""
    from nvfp4train import parallel

    try:
        parallel.shutdown()
    except Exception:  # noqa: BLE001 - the refusal is what the user must see; a failed teardown is not news
        pass


def main() -> None:
    try:
        _cli()
    except StoppedBeforeFirstStep as e:  # SIGTERM / SIGUSR1 / Ctrl-C while starting: a clean stop
        # torchrun stops the other ranks of a failed job this way: say it once. (No import here: the signal
        # may have interrupted torch's import, and importing it again would crash.)
        if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) in ("0", ""):
            print(str(e), file=sys.stderr)
        sys.exit(e.exit_code)  # 0 for a preemption (SLURM requeues), 130 for Ctrl-C


USAGE = """\
usage: python -m nvfp4train.train [group=option ...] [key=value ...] [--cfg job]

Pretrain a hybrid Mamba-Transformer from Hydra configs (configs/train.yaml and its groups). Without
arguments: the tiny CPU model on the bundled corpus in BF16, written to runs/default/ (1-2 minutes on
2 cores). Run the same command again to resume from its latest checkpoint; Ctrl-C saves one first.

config groups (group=option):
{groups}

main keys (key=value; `--cfg job` prints every key with its value, without meanings; what each key means:
docs/configuration.md, and the docstring under each field of the dataclasses in nvfp4train/config/run.py,
nvfp4train/model/config.py, nvfp4train/precision/recipe.py, nvfp4train/optim, nvfp4train/data/config.py):
  out_dir=runs/default        where metrics.jsonl, train.log, config.yaml and checkpoints/ go
  seed=1234                   initial weights, data order, stochastic rounding
  train.max_steps=300         optimizer steps
  train.global_batch_size=16  sequences per step over all ranks;  train.seq_len=128  tokens per sequence
  train.eval_every=0          held-out loss every N steps (0: at the end);  train.eval_sequences=64
  train.save_every=0          checkpoint every N steps (0: at the end);  train.resume=auto|never|DIR
  train.device=auto           auto|cpu|cuda;  train.parallel=ddp|fsdp2|hsdp|deepspeed (several ranks)
  optim.lr=3e-3               peak learning rate (optim.*: OptimConfig in nvfp4train/optim/config.py)
  train.wandb.enabled=true    log to Weights & Biases too (pip install 'nvfp4train[wandb]')

your own data:  data=own data.sources.own.train=[a.jsonl,b.txt] data.sources.own.val=held.jsonl  (docs/data.md)
several GPUs:   torchrun --standalone --nproc_per_node=8 -m nvfp4train.train ...  (docs/gpu.md, docs/slurm.md)
the paper's experiments: python -m nvfp4train.reproduce --help
--cfg job prints the composed config (keys and values) and exits; --hydra-help: Hydra's own flags (e.g. -m for sweeps).\
"""


def usage() -> str:
    from nvfp4train.config import group_options

    groups = []
    for group in ("model", "precision", "data"):
        options = [o for o in group_options(group) if not o.startswith("_")]
        groups.append(f"  {group + ':':<11}" + ", ".join(options))
    return USAGE.format(groups="\n".join(groups))


def _cli() -> None:
    from hydra._internal.utils import get_args_parser  # Hydra's own command line (its flags and overrides)

    args = get_args_parser().parse_args()
    if args.help:  # ours, not Hydra's "powered by Hydra" and the whole config (`--cfg job` prints that)
        print(usage())  # from the config dataclasses and configs/ alone: before torch, which --help does not need
        sys.exit(0)
    stop = StopSignal._active
    with stop.deferred() if stop is not None else contextlib.nullcontext():
        import torch  # noqa: F401  # before our modules, and where a stop signal cannot interrupt its native start-up

    import hydra

    from nvfp4train.config import (
        CONFIG_DIR,
        ConfigError,
        check_complete,
        check_hydra_flags,
        check_overrides,
        compose,
        register_defaults,
    )
    from nvfp4train.launch.errors import fail

    if args.shell_completion:  # Hydra's completion script or its answer: it composes configs, runs no job
        hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(_main)()
        return
    try:
        check_hydra_flags(args)
        check_overrides(args.overrides, launcher=True)
        if args.multirun:  # each job its own out_dir; a submitit launcher's files under out_dir: train/sweep.py
            from nvfp4train.config import RunConfig
            from nvfp4train.config.schema import defaults
            from nvfp4train.train.sweep import sweep_hydra_overrides

            sys.argv += sweep_hydra_overrides(args.overrides, str(defaults(RunConfig)["out_dir"]))
        elif any(a.startswith(("hydra/launcher", "hydra.launcher.")) for a in args.overrides):
            raise ConfigError("hydra/launcher: a launcher runs the jobs of a sweep; add -m (--multirun)")
        if not args.multirun:  # one job: compose it here so that what Hydra would reject is one line too
            composed = compose("train", args.overrides)
            if not args.cfg:  # --cfg job shows a config with its `???` still open
                check_complete(composed)
    except ConfigError as e:
        fail(str(e), 2)  # under torchrun: every rank refuses alike, before any process group; rank 0 says it
    register_defaults()
    hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(_main)()
    from nvfp4train import parallel

    parallel.shutdown()  # once, after every run: the runs of a sweep share the process group


if __name__ == "__main__":
    main()
