"""Where numbers and messages go: metrics.jsonl (always), W&B (when enabled), a progress bar, and the run's
log out_dir/train.log (LogFile).

metrics.jsonl gets one JSON object per logged step; on resume it is truncated to the steps before the
checkpoint, so a resumed run's file reads like one uninterrupted run. A damaged line (a torn write, a
hand edit) costs only itself: the intact records around it are kept, the damaged line is moved to
metrics.jsonl.damaged and the resume says so in one line. The file is rewritten atomically on resume,
and a record that cannot be written whole (disk full) is cut off again, so the file never ends in a
torn line; the run then stops with one line (rundir.RunWriteError). It is strict JSON: a non-finite
number (the loss of a step the guard skipped, flagged `step_skipped`) is written as null, since jq and
JavaScript reject NaN. A resumed run continues the same W&B run (its id is stored in the checkpoint)
in the same group.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import math
import os
import resource
import sys
import time
from pathlib import Path

import torch

from nvfp4train.config import ConfigError, WandbConfig
from nvfp4train.runs import RESOLVED_PREFIX
from nvfp4train.train.rundir import check_own, open_own, write_atomic, write_failed

DAMAGED_SUFFIX = ".damaged"
COMPRESSED_NAME = "metrics.jsonl.gz"  # how results are committed (`reproduce copy-results`): a tenth of the size


def metrics_path(run_dir: Path) -> Path:
    """A run's metrics file: metrics.jsonl, else metrics.jsonl.gz, else the (missing) metrics.jsonl."""
    plain = Path(run_dir) / "metrics.jsonl"
    packed = plain.parent / COMPRESSED_NAME
    return plain if plain.is_file() or not packed.is_file() else packed


def read_metrics_text(path: Path) -> str:
    """The text of metrics.jsonl or metrics.jsonl.gz (OSError, gzip's BadGzipFile included, if unreadable)."""
    path = Path(path)
    if path.suffix == ".gz":
        import gzip

        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    return path.read_text(encoding="utf-8", errors="replace")


def parse_record(line: str) -> dict | None:
    """One metrics.jsonl line as a record (a JSON object with an integer `step`), or None if damaged."""
    try:
        record = json.loads(line)
    except ValueError:  # JSONDecodeError, and a line cut inside a multi-byte character
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int) or isinstance(record["step"], bool):
        return None
    return record


def read_records(path: Path) -> tuple[list[tuple[str, dict]], list[tuple[int, str]]]:
    """([(line, record)] of the intact lines, [(line number, line)] of the damaged ones), in file order."""
    intact, damaged = [], []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        record = parse_record(line)
        if record is None:
            damaged.append((number, line))
        else:
            intact.append((line, record))
    return intact, damaged


def require_wandb():
    """The wandb module, or one line saying how to get it (checked before out_dir is written)."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("train.wandb.enabled=true needs the wandb package: pip install 'nvfp4train[wandb]'") from None
    return wandb


def require_tensorboard():
    """torch's SummaryWriter, or one line saying how to get the tensorboard package it writes with."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "train.tensorboard=true needs the tensorboard package: pip install 'nvfp4train[tensorboard]'"
        ) from None
    return SummaryWriter


class MetricsLogger:
    def __init__(self, out_dir: Path, enabled: bool):
        self.path = out_dir / "metrics.jsonl"
        self.enabled = enabled
        self._file = None
        self._wandb_run = None
        self._tensorboard = None

    def open(self, resume_step: int | None, dropped_to: Path | None = None) -> list[str]:
        """Start the file; on resume keep only records of steps <= resume_step. The later records go to
        `dropped_to` when given (a resume from an older checkpoint abandons a timeline, not its history).
        Returns the lines to log about it (damaged lines set aside)."""
        if not self.enabled:
            return []
        kept, dropped, notes = [], [], []
        # not read through a link, nor from a FIFO (blocks) or a device (/dev/zero: endless): one line instead
        check_own(self.path)
        if resume_step is not None and self.path.exists():
            intact, damaged = read_records(self.path)
            for line, record in intact:
                (kept if record["step"] <= resume_step else dropped).append(line)
            if damaged:
                quarantine = self.path.with_name(self.path.name + DAMAGED_SUFFIX)
                try:
                    fd = open_own(quarantine, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                    with os.fdopen(fd, "a", encoding="utf-8") as f:
                        f.write("".join(f"{self.path.name}:{n}: {line}\n" for n, line in damaged))
                except OSError as e:
                    raise write_failed(quarantine, e) from None
                where = ", ".join(str(n) for n, _ in damaged[:5]) + (" ..." if len(damaged) > 5 else "")
                notes.append(
                    f"{self.path}: {len(damaged)} damaged line(s) skipped (line {where}), moved to "
                    f"{quarantine}; the {len(intact)} intact records are kept"
                )
        if dropped and dropped_to is not None:
            write_atomic(dropped_to, "".join(line + "\n" for line in dropped))
        write_atomic(self.path, "".join(line + "\n" for line in kept))
        self._file = os.fdopen(open_own(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab", buffering=0)
        return notes

    def start_wandb(
        self, cfg: WandbConfig, run_config: dict, experiment: str, out_dir: Path, run_id: str | None
    ) -> str | None:
        """Start (or continue) the W&B run; return its id for the checkpoint."""
        if not (self.enabled and cfg.enabled):
            return run_id
        wandb = require_wandb()

        mode = cfg.mode
        if mode == "auto":  # wandb.init fails at once without a key in online mode: go offline instead
            has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
            mode = "online" if has_key else "offline"
        self._wandb_run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group or experiment,
            name=cfg.name,
            config=run_config,
            dir=str(out_dir),
            mode=mode,
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(silent=True),
        )  # its banner goes to its own log
        # the run's summary shows the loss, held-out losses and throughput, not dozens of data/ and quant/
        # counters (they stay in the charts)
        for prefix in ("data/*", "quant/*"):
            self._wandb_run.define_metric(prefix, summary="none")
        self._wandb_mode = mode
        return self._wandb_run.id

    def start_tensorboard(self, enabled: bool, out_dir: Path) -> None:
        """TensorBoard scalars beside metrics.jsonl, in out_dir/tensorboard/ (a resumed run adds an event file:
        TensorBoard shows the steps of both, the later ones where they overlap)."""
        if self.enabled and enabled:
            self._tensorboard = require_tensorboard()(log_dir=str(out_dir / "tensorboard"))

    def wandb_sync_hint(self) -> str | None:
        """For an offline W&B run, the line that says where it is and how to upload it (W&B's own hint, which
        its silent mode drops)."""
        if self._wandb_run is None or getattr(self, "_wandb_mode", None) != "offline":
            return None
        run_dir = Path(self._wandb_run.dir).parent  # .../wandb/offline-run-<time>-<id> (files/ is inside)
        return f"W&B offline run in {run_dir}; upload it with: wandb sync {run_dir}"

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        data = memoryview((json.dumps(finite, allow_nan=False) + "\n").encode())
        start = self._file.tell()
        try:
            while data:
                data = data[self._file.write(data) :]
        except OSError as e:
            try:  # no torn line: cut the partial record off again (shrinking needs no space)
                self._file.truncate(start)
            except OSError:
                pass
            raise write_failed(self.path, e) from None
        if self._wandb_run is not None:
            # the run plan's resolved/* fields are in the W&B run's config (its `resolved` section) already
            charted = {k: v for k, v in record.items() if k != "step" and not k.startswith(RESOLVED_PREFIX)}
            self._wandb_run.log(charted, step=record["step"])
        if self._tensorboard is not None:  # the same numbers under the same names (the plan is in config.yaml)
            for k, v in finite.items():
                if k == "step" or k.startswith(RESOLVED_PREFIX):
                    continue
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tensorboard.add_scalar(k, v, global_step=record["step"])
            self._tensorboard.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None


class RunLogHandler(logging.FileHandler):
    """out_dir/train.log. A failed write (disk full) does not print logging's traceback for every later
    record: the handler stops writing and keeps the error, which the trainer reports as one line."""

    def __init__(self, path: Path):
        super().__init__(path, mode="a", encoding="utf-8")
        self.failed: Exception | None = None

    def _open(self):
        fd = open_own(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
        elif self.failed is None:
            self.failed = write_failed(Path(self.baseFilename), error)

    def close(self) -> None:
        try:  # what the full disk did not take is lost; the failure was (or is now) reported once
            super().close()
        except OSError as e:
            if self.failed is None:
                self.failed = write_failed(Path(self.baseFilename), e)


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
        show = (
            enabled
            and (setting == "true" or (setting == "auto" and sys.stderr.isatty()))
            and _terminal_columns() >= self.MIN_COLUMNS
        )
        self._bar = None
        self.total, self._started = total, (initial, time.monotonic())  # for the plain lines' ETA
        if show:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        line = f"step {step} loss {loss:.4f} {tokens_per_s:,.0f} tok/s"
        if self._bar is not None:
            self._bar.set_postfix_str(line, refresh=False)
            self._bar.update(1)
        elif self.enabled and step % self.log_every == 0:  # logs (SLURM, CI) get a plain line instead
            print(f"{line} | {self._eta(step)}", flush=True)
        if self.enabled and step % self.log_every == 0:  # train.log gets it either way (INFO: not the terminal)
            logging.getLogger("nvfp4train.train").info(line)

    def _eta(self, step: int) -> str:
        """`37% (111/300), ETA 1m42s`: the bar's progress for a log, the rate measured since this process began."""
        first, since = self._started
        done = max(step - first, 0)
        left = (time.monotonic() - since) / done * (self.total - step) if done else None
        eta = "?" if left is None else f"{int(left // 60)}m{int(left % 60):02d}s" if left >= 60 else f"{left:.0f}s"
        return f"{100 * step / max(self.total, 1):.0f}% ({step}/{self.total}), ETA {eta}"

    def write(self, message: str) -> None:
        logging.getLogger("nvfp4train.train").info(message)  # train.log gets the terminal's lines too
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory so far: the CUDA caching allocator's high-water mark, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class LogFile:
    """The run's full log in out_dir/train.log: every log record from the start of the run (backend choice,
    data epochs, library messages) and the lines the terminal shows; the terminal gets only the banner,
    progress and warnings (configs/train.yaml sets the console handler to WARNING). Records before out_dir
    exists wait in memory."""

    active: LogFile | None = None

    def __init__(self):
        self.buffer = logging.handlers.MemoryHandler(capacity=1 << 20, flushLevel=logging.CRITICAL + 1)
        self.file: RunLogHandler | None = None
        root = logging.getLogger()
        root.addHandler(self.buffer)
        self.root_level = root.level
        root.setLevel(min(root.level or logging.INFO, logging.INFO))
        LogFile.active = self

    def open(self, path: Path) -> None:
        self.file = RunLogHandler(path)
        self.file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        self.buffer.setTarget(self.file)
        self.buffer.flush()
        logging.getLogger().removeHandler(self.buffer)
        logging.getLogger().addHandler(self.file)

    def close(self) -> None:
        root = logging.getLogger()
        for handler in (self.buffer, self.file):
            if handler is not None:
                root.removeHandler(handler)
                handler.close()
        self.file = None
        root.setLevel(self.root_level)
        if LogFile.active is self:
            LogFile.active = None
