"""The Trainer: wires model, precision, data, optimizer, parallelism, checkpoints and metrics.

One optimizer step, as data flows:
  1. the loader hands this rank `grad_accum` micro-batches of the global batch;
  2. the precision controller applies its schedule for the current token fraction;
  3. forward under BF16 autocast (each linear is the precision package's layer), FP32 cross-entropy
     fused with the LM head (model/loss.py), backward; FP32 gradients accumulate over micro-batches
     (DDP/FSDP2 sync on the last one);
  4. global-norm clipping; a non-finite loss or gradient skips the step (decided on the device);
  5. AdamW updates the FP32 master weights at this step's learning rate;
  6. metrics, evaluation and checkpoints at their intervals; SIGTERM/SIGUSR1 save and exit.

The run is split as torchtitan's trainer is, so each part can change without reading the others:
  Trainer(cfg)           build: process group, model, precision, data, engine (nothing written yet)
  trainer.resume()       restore the latest (or the named) checkpoint, if any
  trainer.open_outputs() config.yaml, metrics.jsonl, W&B, progress bar, the start-up banner
  trainer.train_step()   enqueue one optimizer step (the host does not wait for the device)
  trainer.collect()      read the steps enqueued since the last read -> [StepResult] (guard, spikes)
  trainer.log(result)    progress line, metrics record and evaluation at their intervals
  trainer.save()         a checkpoint of everything needed to continue the same stream exactly
`run(cfg)` (train/loop.py) puts them together with preemption. What the build checks and sets up is in
train/build.py; the held-out evaluation in train/heldout.py.

The host reads losses and gradient norms (one transfer for all steps since the last read) only on steps
that need them: log, evaluation, checkpoint and the first and last steps, and on a preemption (ranks
agree on one every train.preempt_check_every steps; a single process checks its flag every step).
Between them the CPU runs ahead of the GPU, so loading data overlaps compute. The guard sees
every step's values in order, so skipped and spiking steps are still recorded; a halt after
train.max_nonfinite_steps non-finite steps in a row is raised at the next read (the steps in between
were computed but, as the run ends without a checkpoint, change nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nvfp4train import parallel
from nvfp4train.config import RunConfig, resolve_micro_batch
from nvfp4train.model import flops_per_token, param_groups
from nvfp4train.optim import lr_at
from nvfp4train.optim.adamw import get_hyperparameters, set_hyperparameters
from nvfp4train.train import checkpoint, identity, resume_policy, rundir
from nvfp4train.train.build import (
    build_model_and_data,
    check_out_dir_writable,
    cpu_threads,
    data_cache_dir,
    mfu_peak,
    persistent_kernel_caches,
    resume_cpu_threads,
    reuse_freed_host_memory,
)
from nvfp4train.train.engines import StepStats, build_engine, import_deepspeed
from nvfp4train.train.fits import check_fits
from nvfp4train.train.guards import NonFiniteGuard, SpikeDetector, TrainingHalted
from nvfp4train.train.heldout import HeldOutGraphs, evaluate_as, runs_in_bf16
from nvfp4train.train.metrics import (
    LogFile,
    MetricsLogger,
    ProgressBar,
    peak_memory_gib,
    require_tensorboard,
    require_wandb,
)
from nvfp4train.train.plan import RESOLVED, RunFacts, plan_run


@dataclass
class StepResult:
    """What one optimizer step produced: read by log(), and by run() for the summary."""

    step: int
    lr: float
    loss: float
    grad_norm: float
    applied: bool  # False: a non-finite loss or gradient skipped the update
    spike: bool
    seconds: float
    tokens_per_s: float
    precision_switch: str | None  # the controller's message when its schedule switched at this step


class Trainer:
    """Everything one run holds. Building it validates the whole config and writes nothing but an
    empty out_dir; each method below is one part of the run, in the order run() calls them."""

    def __init__(self, cfg: RunConfig):
        self.started = time.perf_counter()  # time to first step is counted from here
        self.info = info = parallel.init_distributed(cfg.train.device)
        self.threads_note = cpu_threads() if info.device.type == "cpu" else ""
        if info.device.type == "cpu":
            reuse_freed_host_memory()
        self.kernel_cache = persistent_kernel_caches() if info.device.type == "cuda" else None
        # the micro-batch depends on the world size, known only now; config.yaml records the value used
        micro_derived = cfg.train.micro_batch_size is None
        cfg = dataclasses.replace(cfg, train=resolve_micro_batch(cfg.train, info.world_size))
        self.cfg, t = cfg, cfg.train
        check_fits(cfg, info.world_size, info.device, micro_derived)  # before anything is allocated or written
        check_out_dir_writable(cfg.out_dir)
        # refusals that must come before out_dir, its lock or any file in it exist
        rundir.check_out_dir_place(cfg.out_dir, data_cache_dir(cfg.data))
        self._on_main(lambda: rundir.check_own_files(cfg.out_dir))  # no link in it written (truncated) through
        if t.resume not in ("auto", "never"):
            checkpoint.read_meta(Path(t.resume))  # not a checkpoint at all: one line, nothing written
        if t.wandb.enabled:
            require_wandb()
        if t.tensorboard:
            require_tensorboard()
        if t.parallel == "deepspeed":
            import_deepspeed()  # before out_dir exists: a missing DeepSpeed is a refusal, not a half-made run
        if t.parallel == "hsdp" and info.world_size > 1:
            parallel.hsdp_shape(t.hsdp_shard_size, info.world_size)  # a shard size that does not divide the ranks
        self.model_cfg, self.model, self.controller, self.loader, self.val_data = build_model_and_data(cfg, info)
        # every decision the config left open, made once (train/plan.py): the engine, the progress bar and
        # W&B read it; train.log, config.yaml and the first metrics record say it
        self.plan = plan_run(cfg, info, RunFacts.of(self.model_cfg, self.model, self.controller), micro_derived)
        logging.getLogger("nvfp4train.train.plan").info("run plan:\n" + "\n".join(self.plan.lines()))
        self.lock = rundir.RunDirLock(cfg.out_dir)

        def claim_out_dir():
            try:
                cfg.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise rundir.RunDirError(f"out_dir={str(cfg.out_dir)!r}: not writable ({e.strerror})") from None
            self.lock.acquire()  # held until the process ends: one run per out_dir

        self._on_main(claim_out_dir)

        self.grad_accum = self.plan.grad_accum
        self.tokens_per_step = t.global_batch_size * t.seq_len
        self.ckpt_root = cfg.out_dir / "checkpoints"
        self.guard, self.spikes = NonFiniteGuard(t.max_nonfinite_steps), SpikeDetector(t.spike_factor)
        self.engine = build_engine(
            self.model, lambda m: param_groups(m, cfg.optim.weight_decay), cfg.optim, self.plan, t, info
        )
        # the held-out passes replayed as CUDA graphs where the step is one (one process: no collectives)
        captured = getattr(self.engine, "step_graph", None) is not None and info.world_size == 1
        self.eval_graphs = HeldOutGraphs(info.device) if captured and self.val_data else None
        self.pending: list[tuple[int, float, str | None, StepStats]] = []  # enqueued steps not read yet
        self.read_at = time.perf_counter()  # when the host last waited for the device
        self.time_to_first_step: float | None = None  # build, compilation and kernel autotuning included
        self.flops_per_token = flops_per_token(self.model_cfg, t.seq_len)["total"]
        self.peak = mfu_peak(cfg, self.controller, info)
        self.step = 0  # optimizer steps done
        self.start_step = 0  # where this process began (> 0 after a resume)
        self.resumed_from: Path | None = None
        self.abandoned: Path | None = None  # later checkpoints set aside by a resume from an older one
        self.checkpoint_seconds: float | None = None  # how long the latest save took, until it is logged
        self.wandb_id: str | None = None
        self.run_id = identity.new_run_id()  # this run's identity (train/identity.py); a resume carries it on
        self.resume_notes: list[str] = []  # the changes this resume makes to the run (resume_policy)
        self.unhealthy_since_save = False  # a loss spike or skipped step since the last checkpoint
        self.logger = MetricsLogger(cfg.out_dir, enabled=info.is_main)
        self.bar: ProgressBar | None = None
        self.log_file = LogFile.active or LogFile()
        if not info.is_main:  # one train.log, from rank 0
            self.log_file.close()

    # ------------------------------------------------------------------------------------ resume
    def resume(self) -> None:
        """Restore the engine and every piece of trainer state from train.resume's checkpoint."""
        t = self.cfg.train
        self._on_main(lambda: rundir.check_checkpoints_dir(self.cfg.out_dir))  # before anything is written there
        if self.info.is_main:  # what a kill during the last run's pruning left (out_dir is ours: locked)
            checkpoint.remove_leftovers(self.ckpt_root)
        if t.resume == "auto":
            existing = checkpoint.list_checkpoints(self.ckpt_root)
            self.resumed_from = existing[-1] if existing else None
            if not existing:  # a run's history with nothing to resume it from is not rewritten silently
                config_text = self._config_text()
                self._on_main(lambda: rundir.check_history_resumable(self.cfg.out_dir, t.overwrite, config_text))
        elif t.resume == "never":
            self._on_main(lambda: rundir.check_fresh_start(self.cfg.out_dir, t.overwrite))
        else:
            self.resumed_from = Path(t.resume)
        if self.resumed_from is None:
            self.run_id = parallel.broadcast_from_main(identity.new_run_id(), self.info)
            return
        self.run_id, note = identity.check(self.resumed_from, self.ckpt_root, t.resume_foreign)
        self.run_id = parallel.broadcast_from_main(self.run_id, self.info)
        self.resume_notes = resume_policy.check(self._resumed_run_config(), self.cfg.to_dict(), self.resumed_from)
        if note:
            self.resume_notes.insert(0, note)
        # betas, eps and weight_decay are this run's config: the checkpoint brings the moments, not these
        hyperparameters = get_hyperparameters(self.engine.optimizer)
        if self.info.device.type == "cpu":
            threads, note = resume_cpu_threads(checkpoint.read_meta(self.resumed_from).get("cpu_threads"))
            self.threads_note = threads or self.threads_note
            if note:
                self.resume_notes.append(note)
        meta, state = checkpoint.load(self.resumed_from, self.engine, self.info.rank, self.cfg.model.to_dict())
        set_hyperparameters(self.engine.optimizer, hyperparameters)
        self.step = self.start_step = int(meta["step"])
        if t.resume != "auto":  # an older checkpoint starts a new timeline from its step
            self.abandoned = self._on_main(lambda: rundir.abandon_later(self.ckpt_root, self.start_step))
        self.wandb_id = meta.get("wandb_id")
        checkpoint.check_loader_state(self.resumed_from / f"rank_{self.info.rank:05d}.pt", state["loader"])
        try:
            self.loader.load_state_dict(state["loader"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise checkpoint.CheckpointError(f"{self.resumed_from}: {e}") from None
        parts = [
            ("loader", self.loader.load_state_dict),
            ("precision", self.controller.load_state_dict),
            ("guard", self.guard.load_state_dict),
            ("spikes", self.spikes.load_state_dict),
            ("rng_cpu", torch.set_rng_state),
        ]
        if self.info.device.type == "cuda" and "rng_cuda" in state:
            parts.append(("rng_cuda", torch.cuda.set_rng_state))
        for name, restore in parts:  # a crafted or damaged field is one line naming it, not a traceback
            try:
                restore(state[name])
            except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as e:
                rank_file = self.resumed_from / f"rank_{self.info.rank:05d}.pt"
                raise checkpoint.CheckpointError(
                    f"{rank_file}: field {name!r} cannot be restored ({type(e).__name__}: {str(e)[:200]}); not loaded"
                ) from None

    def _resumed_run_config(self) -> dict:
        """The config of the run being resumed: from the checkpoint's meta.json, or (checkpoints written
        before it was stored there) the config.yaml of the out_dir the checkpoint lives in."""
        meta = checkpoint.read_meta(self.resumed_from)
        if isinstance(meta.get("run_config"), dict):
            return meta["run_config"]
        saved = self.resumed_from.parent.parent / "config.yaml"
        if not saved.is_file():
            return self.cfg.to_dict()
        config = OmegaConf.to_container(OmegaConf.load(saved))
        config.pop(RESOLVED, None)  # the decisions, not the config (they may differ on another machine)
        return config

    def _config_text(self) -> str:
        """config.yaml: the run's config, then the plan's decisions under `resolved:` (rundir.save_config)."""
        return OmegaConf.to_yaml({**self.cfg.to_dict(), RESOLVED: self.plan.to_dict()})

    def open_outputs(self) -> None:
        """config.yaml (the previous one kept as config.step_<N>.yaml when a resume changes it),
        metrics.jsonl (cut back to the resumed step), W&B, progress bar and banner."""
        cfg, t, info = self.cfg, self.cfg.train, self.info
        if info.is_main:  # written whole or not at all; a resume keeps the previous one (rundir.save_config)
            rundir.save_config(
                cfg.out_dir,
                self._config_text(),
                self.start_step if self.resumed_from is not None else None,
            )
            self.log_file.open(cfg.out_dir / "train.log")
        self.resume_notes += self.logger.open(
            resume_step=self.start_step if self.resumed_from is not None else None,
            dropped_to=self.abandoned / "metrics.jsonl" if self.abandoned else None,
        )
        self.wandb_id = self.logger.start_wandb(
            dataclasses.replace(t.wandb, mode=self.plan.wandb_mode or t.wandb.mode),
            {**cfg.to_dict(), RESOLVED: self.plan.decisions()},
            cfg.experiment,
            cfg.out_dir,
            self.wandb_id,
        )
        self.logger.start_tensorboard(t.tensorboard, cfg.out_dir)
        self.bar = ProgressBar(
            self.plan.progress, info.is_main, total=t.max_steps, initial=self.start_step, log_every=t.log_every
        )
        if info.is_main:
            n_params = sum(p.numel() for p in self.model.parameters())
            where = f"resumed from {self.resumed_from}" if self.resumed_from else "from scratch"
            layout = t.parallel if info.world_size > 1 or t.parallel == "deepspeed" else "single"
            self.bar.write(
                f"model {self.model_cfg.name}: {n_params / 1e6:.2f}M params | precision "
                f"{cfg.precision.name} ({self.controller.backend_name}) | {layout} "
                f"x{info.world_size} on {info.device.type}{self.threads_note} | {t.max_steps} steps x "
                f"{self.tokens_per_step} tokens | {where}"
                f"{' | deterministic' if t.deterministic else ''}"
            )
            for note in self.resume_notes:
                self.bar.write(note)
            if self.plan.compile or self.plan.cuda_graph:  # the first step waits for this, silently otherwise
                self.bar.write(self._first_step_note())
            if self.abandoned:
                self.bar.write(
                    f"checkpoints after step {self.start_step} and their metrics moved to "
                    f"{self.abandoned} (a new timeline starts at step {self.start_step})"
                )

    def _first_step_note(self) -> str:
        """What the first step waits for: compilation, the CUDA graph's capture and, on a machine's first run
        of these shapes, Triton's autotuning, each cached for the runs after it (persistent_kernel_caches)."""
        parts = [("compiling the model", self.plan.compile), ("capturing the step", self.plan.cuda_graph)]
        work = " and ".join(what for what, on in parts if on)
        caches = Path(os.environ.get("TRITON_CACHE_DIR", "~/.cache/nvfp4train/triton")).parent
        return (
            f"step 1: {work} (a minute or more the first time these shapes run on this machine, with kernel "
            f"autotuning; seconds once {caches} holds them) ..."
        )

    # ------------------------------------------------------------------------------- one step
    def train_step(self) -> None:
        """Enqueue optimizer step number self.step + 1: schedule, data, forward/backward, update. Nothing
        here waits for the device; collect() reads the results."""
        t, step = self.cfg.train, self.step + 1
        if step == self.start_step + 1:  # the first step's time starts here (the build is time_to_first_step)
            self.read_at = time.perf_counter()
        switch = self.controller.on_step((step - 1) / t.max_steps)
        lr = lr_at(step - 1, t.max_steps, self.cfg.optim.lr, self.cfg.optim.min_lr, self.cfg.optim.schedule)
        micro_batches = [self.loader.next_microbatch() for _ in range(self.grad_accum)]
        self.pending.append((step, lr, switch, self.engine.train_step(micro_batches, lr, step)))
        self.step = step

    def read_due(self) -> bool:
        """Whether the host reads the results now: a log, evaluation or checkpoint step, or the first or
        last step of this process (and, in run(), a preemption)."""
        t, s = self.cfg.train, self.step
        return (
            s % t.log_every == 0
            or s == self.start_step + 1
            or s == t.max_steps
            or bool(t.eval_every and s % t.eval_every == 0)
            or self.save_due()
        )

    def collect(self) -> list[StepResult]:
        """The results of the steps enqueued since the last read, in one device-to-host transfer; the
        guard and the spike detector see them in step order. Raises TrainingHalted (after logging the
        step that tripped the guard and the ones before it)."""
        if not self.pending:
            return []
        values = torch.stack(
            [torch.stack([stats.loss.float(), stats.grad_norm.float()]) for *_, stats in self.pending]
        ).tolist()  # waits for the device
        now = time.perf_counter()
        seconds, self.read_at = (now - self.read_at) / len(self.pending), now  # the mean over the window
        if self.pending[0][0] == self.start_step + 1:
            self.time_to_first_step = now - self.started
        tokens_per_s = self.tokens_per_step / seconds
        results = []
        for (step, lr, switch, _), (loss, grad_norm) in zip(self.pending, values):
            try:
                applied = self.guard.check(step, loss, grad_norm)
            except TrainingHalted as halt:  # record the step that tripped the guard, then stop
                self.pending = []
                for r in results:
                    self.log(r)
                self.log(
                    StepResult(
                        step=step,
                        lr=lr,
                        loss=loss,
                        grad_norm=grad_norm,
                        applied=False,
                        spike=False,
                        seconds=seconds,
                        tokens_per_s=tokens_per_s,
                        precision_switch=switch,
                    )
                )
                raise TrainingHalted(f"{halt}; {self._latest_checkpoint_note(halted=True)}") from None
            results.append(
                StepResult(
                    step=step,
                    lr=lr,
                    loss=loss,
                    grad_norm=grad_norm,
                    applied=applied,
                    spike=self.spikes.update(loss),
                    seconds=seconds,
                    tokens_per_s=tokens_per_s,
                    precision_switch=switch,
                )
            )
            if results[-1].spike or not applied:  # the next checkpoint is not one to fall back on
                self.unhealthy_since_save = True
        self.pending = []
        return results

    # ----------------------------------------------------------------------------------- log
    def log(self, r: StepResult) -> None:
        """Progress line every step; a metrics record on log steps, the first, skipped and spiking
        steps; held-out losses on evaluation steps and the last."""
        t, is_main = self.cfg.train, self.info.is_main
        if r.precision_switch and is_main:
            self.bar.write(f"step {r.step}: {r.precision_switch}")
        if r.step == self.start_step + 1 and self.time_to_first_step is not None:
            logging.getLogger(__name__).info(
                f"time to first step: {self.time_to_first_step:.1f} s (build, resume, compilation, kernel "
                f"autotuning{'; kernel caches in ' + self.kernel_cache if self.kernel_cache else ''})"
            )
        self.bar.update(r.step, r.loss, r.tokens_per_s)
        if r.spike and is_main:
            self.bar.write(f"step {r.step}: loss spike {r.loss:.4f} (running mean {self.spikes.ema:.4f})")

        is_last = r.step == t.max_steps
        record = None
        if (
            r.step % t.log_every == 0
            or is_last
            or r.step == self.start_step + 1
            or not r.applied
            or r.spike
            or r.precision_switch
        ):
            record = {
                "step": r.step,
                "tokens": r.step * self.tokens_per_step,
                "loss": r.loss,
                "lr": r.lr,
                "grad_norm": r.grad_norm,
                "tokens_per_s": r.tokens_per_s,
                "step_time_s": r.seconds,
                "skipped_steps": self.guard.total_skipped,
                "loss_spikes": self.spikes.spikes,
                "step_skipped": not r.applied,
                "loss_spike": r.spike,
            }
            if self.peak is not None:
                record["mfu"] = self.flops_per_token * r.tokens_per_s / self.info.world_size / self.peak[0]
            record["peak_mem_gib"] = peak_memory_gib(self.info.device)
            if r.step == self.start_step + 1:
                record["deterministic"] = t.deterministic  # so that a report can say how its runs were made
                record.update(self.plan.metrics())  # how this process's run was made: resolved/<decision>
                if self.time_to_first_step is not None:
                    record["time_to_first_step_s"] = self.time_to_first_step
            if self.checkpoint_seconds is not None:  # the latest checkpoint's save time, reported once
                record["checkpoint_time_s"], self.checkpoint_seconds = self.checkpoint_seconds, None
            record.update(self.loader.stats())  # keys already start with "data/"
            record.update(self.controller.quant_stats())
            if r.precision_switch:  # so that comparisons can mark where the precision changed
                record["precision_switch"] = r.precision_switch
        if (t.eval_every and r.step % t.eval_every == 0) or is_last:
            record = record or {"step": r.step, "tokens": r.step * self.tokens_per_step}
            layers = self.controller.layers
            if is_main and is_last and self.val_data:  # tens of seconds on a CPU: say what is running
                in_precision = {"bf16": "BF16", "both": "BF16 and training precision"}.get(
                    t.eval_precision, "training precision"
                )
                self.bar.write(
                    f"step {r.step}: held-out evaluation ({in_precision}, up to {t.eval_sequences} sequences "
                    f"per source: {', '.join(self.val_data)}) ..."
                )
            started = time.perf_counter()
            held_out = evaluate_as(
                t.eval_precision,
                self.engine.module,
                self.val_data,
                t.micro_batch_size,
                self.info.device,
                layers,
                graphs=self.eval_graphs,
            )
            self.engine.after_evaluation()
            record.update(held_out)
            if held_out:  # its losses were read to the host: the evaluation is over
                record["eval_time_s"] = time.perf_counter() - started
            if is_main and held_out:
                if t.eval_precision == "both":
                    precision = "BF16 and training precision"
                    trained_in = "bf16" if runs_in_bf16(layers) else self.cfg.precision.name
                    losses = [
                        f"{k[4:]} {v:.4f} (bf16) {held_out['val_tp/' + k[4:]]:.4f} ({trained_in})"
                        for k, v in held_out.items()
                        if k.startswith("val/")
                    ]
                else:
                    precision = "BF16" if t.eval_precision == "bf16" else "training precision"
                    losses = [f"{k[4:]} {v:.4f}" for k, v in held_out.items()]
                line = (
                    f"held-out loss at step {r.step} (in training, {precision}, up to {t.eval_sequences} "
                    "sequences per source): " + ", ".join(losses)
                )
                # the terminal too at the end (train.log always): intermediate ones would crowd the bar
                self.bar.write(line) if is_last else logging.getLogger(__name__).info(line)
        if record is not None:
            try:
                self.logger.log(record)
            except rundir.RunWriteError as e:
                raise rundir.RunWriteError(f"{e}; step {r.step}: {self._latest_checkpoint_note()}") from None
        failed = self.log_file.file is not None and self.log_file.file.failed
        if failed:  # train.log could not be written: stop now, with one line, rather than run on unrecorded
            raise rundir.RunWriteError(f"{failed}; step {r.step}: {self._latest_checkpoint_note()}")

    # ------------------------------------------------------------------------------ checkpoint
    def save_due(self) -> bool:
        t = self.cfg.train
        return bool(t.save_every and self.step % t.save_every == 0) or self.step == t.max_steps

    def save(self, final: bool = False) -> Path | None:
        """Checkpoint the current step (all ranks call this); return its directory.

        A checkpoint must be worth resuming, and pruning must never trade a good one for it: weights or
        optimizer state that are not finite are never written (the run halts), nor is a step whose loss
        was not finite (a periodic save waits for the next one, returning None; a final one halts)."""
        finite = self.engine.state_is_finite().to(torch.int32)
        if self.info.world_size > 1:  # every rank's shard must be finite
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        advice = "Lower optim.lr or keep more blocks in BF16 (precision config)"
        if not bool(finite):
            raise TrainingHalted(
                f"step {self.step}: the weights or optimizer state are not finite, so no checkpoint "
                f"was written; {self._latest_checkpoint_note(halted=True)}. {advice}"
            )
        if self.guard.in_row:  # the same on every rank: the loss is all-reduced before the guard sees it
            if final:
                raise TrainingHalted(
                    f"step {self.step}: the run ends on a step with a non-finite loss, so no "
                    f"checkpoint was written; {self._latest_checkpoint_note(halted=True)}. {advice}"
                )
            if self.info.is_main:
                self.bar.write(
                    f"step {self.step}: non-finite loss, checkpoint skipped (the next one is due "
                    f"in {self.cfg.train.save_every} steps)"
                )
            return None
        state = {
            "loader": self.loader.state_dict(),
            "precision": self.controller.state_dict(),
            "guard": self.guard.state_dict(),
            "spikes": self.spikes.state_dict(),
            "rng_cpu": torch.get_rng_state(),
        }
        if self.info.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state()
        meta = {
            "model_config": self.cfg.model.to_dict(),
            "tokens": self.step * self.tokens_per_step,
            "wandb_id": self.wandb_id,
            "experiment": self.cfg.experiment,
            "run_config": self.cfg.to_dict(),
            "healthy": not self.unhealthy_since_save,
            "identity": identity.of(self.run_id, self.cfg),
        }  # pruning keeps the last healthy one (checkpoint.prune)
        if self.info.device.type == "cpu":  # a resume takes the same count (resume_cpu_threads)
            meta["cpu_threads"] = torch.get_num_threads()
        t0 = time.perf_counter()
        path = checkpoint.save(
            self.ckpt_root,
            self.step,
            self.engine,
            self.info.rank,
            self.info.world_size,
            meta,
            state,
            self.cfg.train.keep_last,
            barrier=lambda: parallel.barrier(self.info),
        )
        self.checkpoint_seconds = time.perf_counter() - t0  # reported with the next metrics record
        self.unhealthy_since_save = False
        return path

    def close(self) -> None:
        if getattr(self, "engine", None) is not None:  # None: the build stopped before the engine
            self.engine.close()
        if self.bar is not None:
            self.bar.close()
        self.logger.close()
        self.log_file.close()

    def _on_main(self, fn):
        """Run fn on the main rank only; a RunDirError it raises stops every rank with its message."""
        result, problem = None, None
        if self.info.is_main:
            try:
                result = fn()
            except rundir.RunDirError as e:
                problem = str(e)
        problem = parallel.broadcast_from_main(problem, self.info)
        if problem:
            raise rundir.RunDirError(problem)
        return result

    def _latest_checkpoint_note(self, halted: bool = False) -> str:
        """Which checkpoint to resume from. After a halt, never one that would halt again: an unhealthy one
        (written after a loss spike or skipped steps), or the one this process resumed from when it wrote
        none since (an exact resume repeats the same steps, so the settings must change first)."""
        done = checkpoint.list_checkpoints(self.ckpt_root)
        good = checkpoint.last_healthy(done)
        if done and good is None:
            return (
                f"every checkpoint ({', '.join(p.name for p in done)}) was written after a loss spike or skipped "
                "steps, so none is advised to resume from"
            )
        if good is not None and good != done[-1]:  # the later ones were written after a loss spike
            later = [p.name for p in done if checkpoint.step_of(p) > checkpoint.step_of(good)]
            note = (
                f"the checkpoints after {good.name} ({', '.join(later)}) were written after a loss spike or "
                f"skipped steps; the last one before it is kept"
            )
        elif done:
            note = f"the latest checkpoint ({done[-1]}) is kept"
        else:
            return "no checkpoint was written"
        resumed = self.resumed_from is not None and good.resolve() == self.resumed_from.resolve()
        if halted and resumed:
            return (
                f"{note}, but this run resumed from it and halted: resuming from it again with the same "
                f"settings repeats the same steps, so change them first (then train.resume={good})"
            )
        return f"{note}: resume from it with train.resume={good}"
