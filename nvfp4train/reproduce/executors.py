"""Where the runs execute: this machine's GPUs (or its CPU), or a SLURM job array.

local: one run per GPU (CUDA_VISIBLE_DEVICES), or one per group of --gpus-per-run GPUs under torchrun;
the rest wait in a queue. With --runs-per-process N a GPU's one-process runs train one after the other in one
worker process (train/worker.py), N of them before a new one starts: imports, CUDA and the compiled kernels
load once, not for every run (run.json's `trained_in_worker`).
Finished runs are skipped; interrupted ones resume through the trainer's own
auto-resume (train.resume=auto: the latest checkpoint in out_dir); one that failed or was killed before its
first checkpoint starts afresh, the earlier attempt's files moved aside into `<out_dir>.replaced-<time>/`.
run.json records the run's commit, GPU, versions and its corpus (the sha256 of each data file it read).
Ctrl-C / SIGTERM reach each trainer once: it checkpoints after its current step and exits, and the same
command later resumes it. Each run ends with the evaluation of its final checkpoint (eval.json: in BF16,
and in the training precision where the experiment's eval line says eval_precision=both) and run.json. A
run of one process evaluates in the training process (train.final_eval: the eval line as its keys; the same
eval.json as the eval command's, without a second start-up); the eval command runs where that wrote none.

slurm: one job array over the runs (slurm/reproduce_array.sbatch), each task `run-one`: the same as one
slot of the local executor. Preemption: SLURM signals the batch shell, which passes SIGTERM to the trainer
(it checkpoints and exits 0) and requeues the task; the requeued task resumes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from nvfp4train.reproduce.experiments import UsageError
from nvfp4train.reproduce.plan import Run, read_json, run_state, shell
from nvfp4train.runs import RunError, read_config, recorded_state
from nvfp4train.train import checkpoint
from nvfp4train.train.rundir import (
    RunDirError,
    RunDirLock,
    check_own_files,
    history_held,
    move_aside,
    open_own,
    write_atomic,
)

REPO = Path(__file__).resolve().parents[2]
SLURM_TEMPLATE = REPO / "slurm" / "reproduce_array.sbatch"
# The executor's own record of a run, which stays in out_dir when a failed attempt's files move aside: the
# claim (another executor must not take the run meanwhile) and run.json (attempts and wall time, summed).
EXECUTOR_RECORDS = ("executor.json", "run.json")


# ------------------------------------------------------------------------------------ one run
def gpu_model(device: str, gpus: str | None) -> str:
    if device == "cpu":
        return "cpu"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", (gpus or "0").split(",")[0]],
            capture_output=True,
            text=True,
            timeout=30,
        )
        name = out.stdout.strip().splitlines()
        if name:
            return name[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "unknown GPU"
    except Exception:  # noqa: BLE001 - a record, never a reason to fail
        return "unknown GPU"


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def deterministic_flag(out_dir: Path) -> bool:
    """train.deterministic of the run's saved config (false where the trainer has no such key, or the config
    cannot be read)."""
    try:
        cfg = read_config(out_dir)
    except (OSError, RunError):
        return False
    return bool((cfg.get("train") or {}).get("deterministic", False))


def corpus_of(out_dir: Path) -> dict[str, str] | None:
    """What the run's data is made from, by the data section its config.yaml saved: "<source>/<split>" -> the
    first 16 hex digits of the sha256 of the split's file (nvfp4train.data.prepare.corpus_record), so that the
    report can tell runs of one comparison trained on different builds of a corpus apart. None where it cannot
    be told: no config.yaml (the trainer did not start), or an input that is gone or unreadable now."""
    import yaml

    from nvfp4train.data.prepare import corpus_record

    try:
        cfg = yaml.safe_load((out_dir / "config.yaml").read_text()) or {}
        return corpus_record(cfg["data"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):  # a record, never a reason to fail
        return None


def evaluated_since(out_dir: Path, run: Run, since: float) -> bool:
    """Whether the trainer's final evaluation (train.final_eval) wrote eval.json of the run's last step during
    this attempt."""
    path = out_dir / "eval.json"
    try:
        written = path.stat().st_mtime
        step = json.loads(path.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return False
    return step == run.max_steps and written >= since - 1.0


def child_env(gpus: str | None, runs_at_once: int) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if "OMP_NUM_THREADS" not in env:  # the cores shared among the runs at once (the data loader is light)
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // runs_at_once))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


class TrainWorker:
    """A `python -m nvfp4train.train.worker` process of one slot: it trains the slot's runs one after the other
    (train/worker.py), at most `runs` of them, then a new one starts."""

    def __init__(self, gpus: str | None, runs_at_once: int, runs: int):
        self.gpus, self.runs_at_once, self.runs_left = gpus, runs_at_once, runs
        self.proc: subprocess.Popen | None = None

    def train(self, args: list[str], console: Path) -> int:
        """One run's exit status; the run's output is appended to `console`."""
        if self.proc is None or self.proc.poll() is not None or self.runs_left <= 0:
            self.close()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nvfp4train.train.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                env=child_env(self.gpus, self.runs_at_once),
                start_new_session=True,  # as a trainer of its own: only the executor passes a stop signal on
                text=True,
            )
        self.runs_left -= 1
        try:
            self.proc.stdin.write(json.dumps({"args": args, "console": str(console)}) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            answer = ""
        if not answer:  # the worker is gone (killed, or crashed in native code): its exit status is the run's
            rc = self.proc.wait()
            self.proc = None
            return rc if rc != 0 else 1
        reply = json.loads(answer)
        if reply.get("stopped") or reply.get("rc") == 1:  # the worker ends itself after these
            self.proc.wait()
            self.proc = None
        return int(reply["rc"])

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.stdin.write("\n")
                    self.proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    pass
            self.proc.wait()
            self.proc = None


class RunProcess:
    """Train (resuming what is there), then evaluate, then write run.json. stop() passes one SIGTERM to
    the process running now: the trainer checkpoints and exits; nothing further starts. With a `worker`
    (TrainWorker), a one-process training command runs in it instead of a process of its own."""

    def __init__(
        self,
        run: Run,
        commit: str,
        gpus: str | None,
        gpus_per_run: int = 1,
        log=None,
        runs_at_once: int = 1,
        worker: TrainWorker | None = None,
    ):
        self.run, self.commit, self.gpus, self.gpus_per_run = run, commit, gpus, gpus_per_run
        self.runs_at_once = runs_at_once
        self.log = log or (lambda line: print(line, flush=True))
        self.proc: subprocess.Popen | None = None
        self.worker = worker
        self.trained_in_worker = False
        self.stopping = False

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self.stopping = True
        if self.proc is None and self.worker is not None and self.worker.proc is not None:
            try:
                os.killpg(self.worker.proc.pid, signum)
            except ProcessLookupError:
                pass
            return
        if self.proc is not None and self.proc.poll() is None:
            try:
                # the run's own session: the trainer, or torchrun, which forwards SIGINT/SIGTERM to its ranks
                # (each rank has a session of its own, so only the launcher can reach them)
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def _call(self, command: list[str], console) -> int:
        env = child_env(self.gpus, self.runs_at_once)
        trainer = [sys.executable, "-m", "nvfp4train.train"]
        in_worker = self.worker is not None and command[:3] == trainer
        console.write(f"$ {shell(command)}{'  (in a worker process)' if in_worker else ''}\n")
        console.flush()
        if in_worker:
            self.trained_in_worker = True
            if self.stopping:
                return 0
            return self.worker.train(command[3:], self.run.out_dir / "console.log")
        # A session of its own: a terminal's Ctrl-C reaches the executor only, which passes it on once
        # (a second SIGINT makes the trainer exit without its checkpoint).
        self.proc = subprocess.Popen(
            command, stdout=console, stderr=console, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        if self.stopping:
            self.stop()
        rc = self.proc.wait()
        self.proc = None
        return rc

    def claim(self) -> bool:
        """Take the run for this process: its out_dir's executor.json, created only where none exists, so that
        two executors sharing a runs directory (two `run` commands on one node) never train the same run. A
        marker whose process is gone is replaced. False: another live executor holds the run."""
        out_dir = self.run.out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        marker = out_dir / "executor.json"
        record = json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "started": time.time()})
        for _ in range(2):
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
            except FileExistsError:
                if run_state(out_dir) == "running":
                    return False
                marker.unlink(missing_ok=True)  # left by an executor that is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(record)
            return True
        return False

    def set_aside_history_without_checkpoint(self, previous: dict) -> None:
        """An earlier attempt that logged steps (or wrote its config) but no complete checkpoint cannot be
        resumed, and the trainer refuses to start from scratch over its history (train.resume=auto): move
        the attempt's files aside into `<out_dir>.replaced-<time>/`, as train.overwrite=true would, but keep
        EXECUTOR_RECORDS in place, then the trainer starts afresh. A run with a checkpoint resumes from it."""
        out_dir = self.run.out_dir
        if checkpoint.list_checkpoints(out_dir / "checkpoints") or not history_held(out_dir):
            return
        with RunDirLock(out_dir):  # refused in one line while a trainer (started by hand, say) holds out_dir
            aside = move_aside(out_dir, keep=EXECUTOR_RECORDS)
        how = "failed" if recorded_state(previous) == "failed" else "was interrupted"
        self.log(f"{self.run.key}: {how} before its first checkpoint; its history is kept in {aside}; starting afresh")

    def execute(self) -> str:
        """The run's state when this returns: done | failed | interrupted, or running (another executor
        holds it: nothing was started here)."""
        run, out_dir = self.run, self.run.out_dir
        if not self.claim():
            self.log(f"{run.key}: running in another executor; left to it")
            return "running"
        if (read_json(out_dir / "run.json") or {}).get("state") == "done":  # by another executor, since planned
            (out_dir / "executor.json").unlink(missing_ok=True)
            self.log(f"{run.key}: done by another executor")
            return "done"
        marker = out_dir / "executor.json"
        try:  # console.log, run.json and the trainer's files: never written through a link in the run directory
            check_own_files(out_dir)
        except RunDirError as e:
            marker.unlink(missing_ok=True)
            self.log(f"{run.key}: not started: {e}")
            return "failed"
        previous = read_json(out_dir / "run.json") or {}
        try:
            self.set_aside_history_without_checkpoint(previous)
        except RunDirError as e:
            marker.unlink(missing_ok=True)
            self.log(f"{run.key}: not started: {e}")
            return "failed"
        attempts = int(previous.get("attempts", 0)) + 1
        started = time.time()
        train_rc, eval_rc, state = None, None, "interrupted"
        # one process where it can: the trainer evaluates its final checkpoint (train.final_eval), and the eval
        # command runs only where that did not write this attempt's eval.json
        train_command = run.train_command(self.gpus_per_run)
        in_training = run.final_eval_overrides() if self.gpus_per_run == 1 else None
        train_command += in_training or []
        evaluated_in_training = False
        try:
            console_fd = open_own(out_dir / "console.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            with os.fdopen(console_fd, "a") as console:
                train_rc = self._call(train_command, console)
                # exit 0 also after a stop signal (checkpoint saved): finished only with the final checkpoint
                if train_rc == 0 and run.final_checkpoint().is_dir():
                    command = run.eval_command()
                    evaluated_in_training = in_training is not None and evaluated_since(out_dir, run, started)
                    if evaluated_in_training:
                        eval_rc = 0
                    elif command is not None and not self.stopping:
                        eval_rc = self._call(command, console)
                    if command is None or eval_rc == 0:
                        state = "done"
                    elif not self.stopping:
                        state = "failed"
                elif train_rc != 0 and not self.stopping:
                    state = "failed"
        finally:
            marker.unlink(missing_ok=True)
        finished = time.time()
        info = {
            "experiment": run.experiment,
            "arm": run.arm,
            "seed": run.seed,
            "state": state,
            "train_command": shell(train_command),
            "eval_command": shell(run.eval_command()) if run.eval_args is not None else None,
            "eval_in_training": evaluated_in_training,
            "trained_in_worker": self.trained_in_worker,  # --runs-per-process: with other runs in one process
            "commit": self.commit,
            "gpu": gpu_model(run.device, self.gpus),
            "gpus": self.gpus_per_run,
            "torch": package_version("torch"),
            "python": sys.version.split()[0],
            "host": socket.gethostname(),
            "deterministic": deterministic_flag(out_dir),
            "corpus": corpus_of(out_dir) or previous.get("corpus"),
            "started": previous.get("started", started),
            "finished": finished,
            "wall_s": round(float(previous.get("wall_s", 0.0)) + finished - started, 1),
            "attempts": attempts,
            "train_rc": train_rc,
            "eval_rc": eval_rc,
            "max_steps": run.max_steps,
            "tokens": run.tokens,
        }
        write_atomic(out_dir / "run.json", json.dumps(info, indent=1) + "\n")
        self.log(
            f"{run.key}: {state} (train exit {train_rc}, eval exit {eval_rc}, {finished - started:.0f} s)"
            + ("" if state != "failed" else f"; see {out_dir / 'console.log'}")
        )
        return state


# ------------------------------------------------------------------------------------- local
def visible_gpus(requested: str | None, device: str) -> list[str]:
    if device == "cpu":
        return []
    if requested:
        ids = [g.strip() for g in requested.split(",") if g.strip()]
        if not ids or not all(g.isdigit() for g in ids):
            raise UsageError(f"--gpus {requested!r}: expected comma-separated GPU indices, e.g. 0,1")
        return ids
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [g for g in env.split(",") if g]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_slots(gpus: list[str], gpus_per_run: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each slot (None: CPU, one slot)."""
    if not gpus:
        return [None]
    if gpus_per_run < 1 or gpus_per_run > len(gpus):
        raise UsageError(f"--gpus-per-run {gpus_per_run}: allowed 1 to {len(gpus)} (the GPUs given: {','.join(gpus)})")
    n = len(gpus) // gpus_per_run
    return [",".join(gpus[i * gpus_per_run : (i + 1) * gpus_per_run]) for i in range(n)]


def run_local(
    runs: list[Run], slots: list[str | None], commit: str, gpus_per_run: int, runs_per_process: int = 1
) -> int:
    """Run the queue on the slots; returns the number of runs that did not finish. runs_per_process > 1: each
    slot trains its one-process runs in a worker process (TrainWorker), that many before a new one starts."""
    queue = list(runs)
    lock = threading.Lock()
    active: list[RunProcess] = []
    results: dict[str, str] = {}
    stopping = threading.Event()

    def on_signal(signum, frame):
        if stopping.is_set():
            return
        stopping.set()
        print(
            f"\nreceived {signal.Signals(signum).name}: the running runs checkpoint and stop; "
            "run the same command again to resume them",
            flush=True,
        )
        with lock:
            for rp in active:
                rp.stop()

    def worker(slot: str | None):
        trainer = (
            TrainWorker(slot, len(slots), runs_per_process) if runs_per_process > 1 and gpus_per_run == 1 else None
        )
        try:
            while not stopping.is_set():
                with lock:
                    if not queue:
                        return
                    run = queue.pop(0)
                    rp = RunProcess(run, commit, slot, gpus_per_run, runs_at_once=len(slots), worker=trainer)
                    active.append(rp)
                print(f"{run.key}: start on {'cpu' if slot is None else 'GPU ' + slot}", flush=True)
                results[run.key] = rp.execute()
                with lock:
                    active.remove(rp)
        finally:
            if trainer is not None:
                trainer.close()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        threads = [threading.Thread(target=worker, args=(slot,), daemon=True) for slot in slots]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    unfinished = [r.key for r in runs if results.get(r.key) != "done"]
    print(
        f"{len(runs) - len(unfinished)} of {len(runs)} run(s) done"
        + (f"; not done: {', '.join(unfinished)}" if unfinished else ""),
        flush=True,
    )
    return len(unfinished)


# ------------------------------------------------------------------------------------- slurm
def render_slurm(
    experiment: str,
    runs: list[Run],
    runs_dir: Path,
    experiments_dir: Path,
    gpus_per_run: int,
    template: Path = SLURM_TEMPLATE,
    extra_sbatch: list[str] | None = None,
) -> tuple[Path, str]:
    """Write <runs-dir>/<experiment>/slurm/{runs.txt, array.sbatch}; return (the sbatch path, its text)."""
    if not template.is_file():
        raise UsageError(f"{template}: the SLURM template is missing")
    where = Path(runs_dir) / experiment / "slurm"
    where.mkdir(parents=True, exist_ok=True)
    write_atomic(where / "runs.txt", "".join(f"{r.arm} {r.seed}\n" for r in runs))
    text = template.read_text()
    values = {
        "@JOB_NAME@": f"repro-{experiment}",
        "@ARRAY@": f"0-{len(runs) - 1}",
        "@GPUS@": str(gpus_per_run),
        "@EXPERIMENT@": experiment,
        "@RUNS_DIR@": str(Path(runs_dir).resolve()),
        "@EXPERIMENTS_DIR@": str(Path(experiments_dir).resolve()),
        "@RUN_LIST@": str((where / "runs.txt").resolve()),
        "@LOG_DIR@": str(where.resolve()),
        "@REPO@": str(REPO),
    }
    for key, value in values.items():
        text = text.replace(key, value)
    if extra_sbatch:
        head, _, rest = text.partition("\n")
        text = (
            head
            + "\n"
            + "".join(f"#SBATCH {'' if line.startswith('-') else '--'}{line}\n" for line in extra_sbatch)
            + rest
        )
    path = where / "array.sbatch"
    write_atomic(path, text)
    return path, text


def submit_slurm(path: Path) -> str:
    try:
        out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise UsageError(
            "sbatch: not found on this machine (submit from a SLURM login node, or use --dry-run "
            "to render the job array only)"
        ) from None
    if out.returncode != 0:
        raise UsageError(f"sbatch {path}: {' '.join((out.stderr or out.stdout).split())}")
    return out.stdout.strip()
