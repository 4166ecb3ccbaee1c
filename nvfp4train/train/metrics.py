"""Where numbers go: metrics.jsonl (always), W&B (when enabled), and a progress bar.

metrics.jsonl gets one JSON object per logged step; on resume it is truncated to the steps before the
checkpoint, so a resumed run's file reads like one uninterrupted run. It is strict JSON: a non-finite
number (the loss of a step the guard skipped, flagged `step_skipped`) is written as null, since jq and
JavaScript reject NaN. A resumed run continues the same W&B run (its id is stored in the checkpoint)
in the same group.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

from nvfp4train.train.config import ConfigError, WandbConfig


class MetricsLogger:
    def __init__(self, out_dir: Path, enabled: bool):
        self.path = out_dir / "metrics.jsonl"
        self.enabled = enabled
        self._file = None
        self._wandb_run = None

    def open(self, resume_step: int | None, dropped_to: Path | None = None) -> None:
        """Start the file; on resume keep only records of steps <= resume_step. The later records go to
        `dropped_to` when given (a resume from an older checkpoint abandons a timeline, not its history)."""
        if not self.enabled:
            return
        kept, dropped = [], []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break  # a torn last line from a killed run
                (kept if record.get("step", math.inf) <= resume_step else dropped).append(line)
        if dropped and dropped_to is not None:
            dropped_to.write_text("".join(line + "\n" for line in dropped))
        self._file = open(self.path, "w")
        for line in kept:
            self._file.write(line + "\n")
        self._file.flush()

    def start_wandb(self, cfg: WandbConfig, run_config: dict, experiment: str, out_dir: Path,
                    run_id: str | None) -> str | None:
        """Start (or continue) the W&B run; return its id for the checkpoint."""
        if not (self.enabled and cfg.enabled):
            return run_id
        try:
            import wandb
        except ImportError:
            raise ConfigError("train.wandb.enabled=true needs the wandb package: pip install 'nvfp4train[wandb]'") from None

        mode = cfg.mode
        if mode == "auto":  # wandb.init fails at once without a key in online mode: go offline instead
            has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
            mode = "online" if has_key else "offline"
        self._wandb_run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group or experiment,
                                     name=cfg.name, config=run_config, dir=str(out_dir), mode=mode,
                                     id=run_id, resume="allow" if run_id else None,
                                     settings=wandb.Settings(silent=True))  # its banner goes to its own log
        # the run's summary shows the loss, held-out losses and throughput, not dozens of data/ and quant/
        # counters (they stay in the charts)
        for prefix in ("data/*", "quant/*"):
            self._wandb_run.define_metric(prefix, summary="none")
        return self._wandb_run.id

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        self._file.write(json.dumps(finite, allow_nan=False) + "\n")
        self._file.flush()
        if self._wandb_run is not None:
            self._wandb_run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None


def _terminal_columns() -> int:
    """Width of the terminal stderr writes to; 0 when it has none (a pipe, or a pty that reports 0x0)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class ProgressBar:
    """A tqdm bar showing step, loss and tokens/s; plain lines every log_every steps instead when the bar
    cannot draw (not a terminal, or a terminal without a size: tqdm would draw nothing at all there)."""

    MIN_COLUMNS = 40

    def __init__(self, setting: str, enabled: bool, total: int, initial: int, log_every: int = 10):
        setting = str(setting).lower()
        self.enabled, self.log_every = enabled, log_every
        show = (enabled and (setting == "true" or (setting == "auto" and sys.stderr.isatty()))
                and _terminal_columns() >= self.MIN_COLUMNS)
        self._bar = None
        if show:
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        line = f"step {step} loss {loss:.4f} {tokens_per_s:,.0f} tok/s"
        if self._bar is not None:
            self._bar.set_postfix_str(line, refresh=False)
            self._bar.update(1)
        elif self.enabled and step % self.log_every == 0:  # logs (SLURM, CI) get a plain line instead
            print(line, flush=True)
        if self.enabled and step % self.log_every == 0:  # train.log gets it either way (INFO: not the terminal)
            logging.getLogger("nvfp4train.train").info(line)

    def write(self, message: str) -> None:
        logging.getLogger("nvfp4train.train").info(message)  # train.log gets the terminal's lines too
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
