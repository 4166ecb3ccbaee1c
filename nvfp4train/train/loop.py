"""`run(cfg)`: one training run, start to end, with preemption.

It puts the Trainer's parts (train/trainer.py) together: build, resume, open the outputs, then step until
train.max_steps, reading the results, logging and checkpointing when they are due. A signal
(SIGTERM/SIGUSR1 from a scheduler, SIGINT from Ctrl-C) is answered with a checkpoint after the current
step and an exit code the job script can requeue on: ranks agree on one every train.preempt_check_every
steps (a single process checks its flag every step). The process group outlives run() (the runs of a
Hydra sweep share it): train/__main__.py destroys it once, at the end.
"""

from __future__ import annotations

import math
import os
import signal
import time

import torch

from nvfp4train import parallel
from nvfp4train.config import RunConfig
from nvfp4train.train import determinism
from nvfp4train.train.metrics import LogFile
from nvfp4train.train.profiling import StepProfiler
from nvfp4train.train.stop import StopSignal, exit_code
from nvfp4train.train.trainer import Trainer


def _agree(flag: bool, info: parallel.DistInfo) -> bool:
    """True on every rank if it is true on any (a signal may reach one rank first)."""
    if info.world_size == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


def run(cfg: RunConfig) -> dict:
    """Train as configured; return a summary (final step, loss, checkpoint path, and a note when there was
    nothing to do)."""
    stop = StopSignal.install()  # train/__main__.py installs it before its imports; a caller of run() here
    log_file = LogFile()
    try:
        with determinism.deterministic_mode(cfg.train.deterministic):  # before CUDA starts (cuBLAS's workspace)
            return _run(cfg, stop)
    finally:
        log_file.close()
        stop.restore()


def _profiler(cfg: RunConfig, trainer: Trainer) -> StepProfiler:
    """train.profile_start's window, moved past the CUDA graph's capture (this process's first graphed step:
    a capture is not profiled) and said so."""
    t, start = cfg.train, cfg.train.profile_start
    captured = trainer.engine.captured_at(trainer.start_step)
    if start and captured is not None:
        if start <= captured:
            if trainer.info.is_main:
                trainer.bar.write(
                    f"train.profile_start={start}: the CUDA graph is captured at step {captured}; "
                    f"profiling steps {captured + 1}-{captured + t.profile_steps} instead"
                )
            start = captured + 1
    return StepProfiler(start, t.profile_steps, cfg.out_dir, trainer.info.rank, trainer.info.device, trainer.bar.write)


def measured(steps: int, tokens_per_step: int, seconds: float, cpu_seconds: tuple[float, float]) -> str:
    """What the run measured, so that a slow machine says why: the throughput over this process's steps
    (evaluation and checkpoints included), the threads it used, the CPU time it got in those seconds
    (cpu_seconds: user and system, all threads; less than seconds x threads: other processes had the
    cores; much of it in the kernel: page faults, memory pressure) and the machine's load, this run's
    own threads included."""
    if steps <= 0 or seconds <= 0:
        return ""
    try:
        load = f", load average {os.getloadavg()[0]:.1f} (this run included)"
    except OSError:  # not every platform has one
        load = ""
    threads = torch.get_num_threads()
    user, system = cpu_seconds
    return (
        f" | {steps * tokens_per_step / seconds:,.0f} tok/s in {seconds:.0f} s on {threads} "
        f"thread{'s' if threads > 1 else ''}, CPU time {user + system:.0f} s ({system:.0f} s of it in the kernel){load}"
    )


def _cpu_seconds() -> tuple[float, float]:
    """This process's user and system CPU time so far, all threads."""
    times = os.times()
    return times.user, times.system


def _run(cfg: RunConfig, stop: StopSignal) -> dict:
    trainer = Trainer(cfg)
    trainer.resume()
    info = trainer.info
    if trainer.step >= cfg.train.max_steps:  # a finished run, run again
        stop.starting = False
        trainer.close()
        note = (
            f"nothing to do: {trainer.resumed_from} is at step {trainer.step} and train.max_steps="
            f"{cfg.train.max_steps} (raise train.max_steps to train further, or train.resume=never "
            f"train.overwrite=true to start again)"
        )
        return {
            "step": trainer.step,
            "loss": math.nan,
            "checkpoint": str(trainer.resumed_from),
            "out_dir": str(cfg.out_dir),
            "rank": info.rank,
            "note": note,
        }
    trainer.open_outputs()
    last_ckpt, loss = None, math.nan
    trainer.model.train()
    profiler = _profiler(cfg, trainer)
    try:
        stop.starting = False  # from here a signal is answered with a checkpoint after the current step
        if stop.received is not None:  # arrived between the handler's last check and now
            raise stop.stopped()
        first_step, started, cpu_started = trainer.step, time.monotonic(), _cpu_seconds()
        while trainer.step < cfg.train.max_steps:
            profiler.before_step(trainer.step + 1)
            trainer.train_step()
            profiler.after_step(trainer.step)
            # one process reads its flag every step; ranks agree (a host sync) every preempt_check_every steps
            preempted = (info.world_size == 1 or trainer.step % cfg.train.preempt_check_every == 0) and _agree(
                stop.received is not None, info
            )
            if not (trainer.read_due() or preempted):
                continue
            for result in trainer.collect():
                loss = result.loss
                trainer.log(result)
            if trainer.save_due() or preempted:
                last_ckpt = trainer.save(final=preempted or trainer.step == cfg.train.max_steps) or last_ckpt
            # the next window's step time counts training only, not this read's evaluation or checkpoint
            trainer.read_at = time.perf_counter()
            if preempted:
                break
        profiler.finish(trainer.step)  # a run that ended inside the window (a preemption): the steps profiled
        if info.is_main:  # the last line of the terminal and of train.log
            if stop.received == signal.SIGINT:
                trainer.bar.write(
                    f"interrupted at step {trainer.step} of {cfg.train.max_steps}: checkpoint "
                    f"{last_ckpt} saved; run the same command to resume"
                )
            elif stop.received is not None:
                trainer.bar.write(
                    f"received {stop.name}: checkpoint {last_ckpt} saved at step {trainer.step}; "
                    "exiting so the job can be requeued (the same command resumes)"
                )
            elif last_ckpt:
                seconds = time.monotonic() - started
                (user, system), (user0, system0) = _cpu_seconds(), cpu_started
                cpu_used = (user - user0, system - system0)
                trainer.bar.write(
                    f"done: step {trainer.step}, loss {loss:.4f}, checkpoint {last_ckpt}"
                    f"{measured(trainer.step - first_step, trainer.tokens_per_step, seconds, cpu_used)}"
                )
            hint = trainer.logger.wandb_sync_hint()
            if hint:
                trainer.bar.write(hint)
    finally:
        trainer.close()
    parallel.barrier(info)
    return {
        "step": trainer.step,
        "loss": loss,
        "checkpoint": str(last_ckpt) if last_ckpt else None,
        "out_dir": str(cfg.out_dir),
        "rank": info.rank,
        "exit_code": exit_code(stop.received),
    }
