"""Ctrl-C and signals during start-up: a run never ends in a traceback or loses its steps.

SIGINT checkpoints like SIGTERM but exits 130 (so `train && eval` stops there) with "interrupted at step
N of M"; SIGTERM/SIGUSR1 exit 0 (SLURM requeues); a second Ctrl-C exits at once (130); a signal that
arrives while the run is starting ends it with one line; a finished run run again says there was nothing
to do; the default micro-batch follows the world size."""

import dataclasses
import fcntl
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvfp4train.config import ConfigError, TrainConfig, resolve_micro_batch
from tests.conftest import REPO, cli_env, read_metrics, run_train, train_cmd

TINY = [
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=32",
    "train.global_batch_size=4",
]


def _start(spawn, out, *extra):
    return spawn(
        train_cmd(f"out_dir={out}", *TINY, *extra),
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_steps(out, proc, n=2, timeout=300):
    t0 = time.time()
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.communicate(timeout=60)
        assert time.time() - t0 < timeout, "no steps logged"
        time.sleep(0.05)


def test_ctrl_c_checkpoints_and_exits_with_one_line(tmp_path, spawn):
    out = tmp_path / "run"
    proc = _start(spawn, out, "train.max_steps=5000")
    _wait_for_steps(out, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (ckpt,) = sorted((out / "checkpoints").glob("step_*"))
    step = int(ckpt.name[5:])
    last = stdout.strip().splitlines()[-1]
    assert last == f"interrupted at step {step} of 5000: checkpoint {ckpt} saved; run the same command to resume"
    assert "requeue" not in stdout and "done:" not in stdout
    assert [r for r in read_metrics(out) if "loss" in r][-1]["step"] == step
    assert (out / "train.log").read_text().strip().endswith(last)


def test_second_ctrl_c_exits_at_once(tmp_path, spawn):
    out = tmp_path / "run"
    proc = _start(spawn, out, "train.max_steps=5000", "train.seq_len=512", "train.global_batch_size=16")  # slow steps
    _wait_for_steps(out, proc, n=1)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "exiting now" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_signal_during_start_up_stops_with_one_line(tmp_path, sig, spawn):
    out = tmp_path / "run"
    proc = _start(spawn, out, "train.max_steps=5")
    time.sleep(1.0)  # the handler is installed before torch is imported, and the first step is seconds away
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == (130 if sig == signal.SIGINT else 0), (stdout, stderr)
    assert stderr.strip() == f"received {sig.name} before the first step: stopped, nothing to save"
    assert not (out / "checkpoints").exists()


def test_finished_run_run_again_says_nothing_to_do(tmp_path):
    out = tmp_path / "run"
    run_train(f"out_dir={out}", *TINY, "train.max_steps=2")
    again = run_train(f"out_dir={out}", *TINY, "train.max_steps=2")
    assert "nothing to do" in again.stdout and "step_00000002 is at step 2" in again.stdout
    assert len(read_metrics(out)) >= 2  # the finished run's metrics stay


def test_micro_batch_follows_the_world_size():
    default = TrainConfig()
    assert default.micro_batch_size is None
    assert [resolve_micro_batch(default, w).micro_batch_size for w in (1, 2, 4, 8, 16)] == [16, 8, 4, 2, 1]
    # each hint names a value that works, not another key that cannot help
    with pytest.raises(ConfigError, match="multiple of the world size 3: set train.global_batch_size=15 or "
                       "train.global_batch_size=18"):  # fmt: skip
        resolve_micro_batch(default, 3)
    assert resolve_micro_batch(dataclasses.replace(default, global_batch_size=18), 3).micro_batch_size == 6
    with pytest.raises(ConfigError, match=r"train.micro_batch_size x world size = 16 x 2 = 32: set "
                       r"train.global_batch_size=32, or train.micro_batch_size one of 1, 2, 4, 8$"):  # fmt: skip
        resolve_micro_batch(TrainConfig(micro_batch_size=16), 2)
    for micro in (1, 2, 4, 8):
        assert resolve_micro_batch(TrainConfig(micro_batch_size=micro), 2).micro_batch_size == micro
    assert resolve_micro_batch(TrainConfig(micro_batch_size=4), 2).micro_batch_size == 4  # accumulation 2


def _launch(spawn, launcher, out, *extra):
    cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node=2", *extra]
    cmd += ["-m", "nvfp4train.train", f"out_dir={out}", *TINY, "train.max_steps=5000", "train.parallel=ddp"]
    return spawn(
        cmd, cwd=REPO, env=cli_env(OMP_NUM_THREADS=1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_launcher_stopped_by_a_signal_exits_with_the_workers_code_and_no_traceback(tmp_path, sig, spawn):
    """Stock torchrun answers SIGTERM with its agent's SignalException traceback and exit 1; the launcher
    passes the signal on, and exits as one trainer would: 0 after SIGTERM (checkpoint saved, requeue), 130
    after Ctrl-C."""
    out = tmp_path / "run"
    proc = _launch(spawn, "nvfp4train.launch", out)
    _wait_for_steps(out, proc, n=3)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == (130 if sig == signal.SIGINT else 0), stderr
    assert "Traceback" not in stderr and "SignalException" not in stderr and "error:" not in stderr, stderr
    (ckpt,) = sorted((out / "checkpoints").glob("step_*"))
    assert (
        stdout.strip()
        .splitlines()[-1]
        .startswith(f"received SIGTERM: checkpoint {ckpt} saved" if sig == signal.SIGTERM else "interrupted at step")
    ), stdout[-2000:]


def test_launcher_says_which_rank_it_killed_when_the_shutdown_timeout_ran_out(tmp_path, spawn):
    out = tmp_path / "run"
    proc = _launch(spawn, "nvfp4train.launch", out, "--shutdown_timeout=0")  # SIGKILL right after SIGTERM
    _wait_for_steps(out, proc, n=3)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 137, stderr
    assert stderr.strip() == (
        "error: nvfp4train.train: local rank 0 did not stop within 0 s of SIGTERM and was killed (its checkpoint "
        "was not written; raise --shutdown_timeout)"
    )
    assert not list((out / "checkpoints").glob("step_*[0-9]"))


def test_stock_torchrun_prints_its_own_traceback_on_sigterm(tmp_path, spawn):
    """What docs/distributed.md says of stock torchrun: the workers still checkpoint, torchrun itself prints
    its agent's traceback and exits 1. Should a torch release change that, this fails and the docs follow."""
    out = tmp_path / "run"
    proc = _launch(spawn, "torch.distributed.run", out)
    _wait_for_steps(out, proc, n=3)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "SignalException" in stderr, stderr[-2000:]
    assert "received SIGTERM: checkpoint" in stdout


def _lock_of_first_source(cache) -> Path:
    """The lock that a trainer with data.cache_dir=cache takes first, to build its first source's shards."""
    from nvfp4train.config import load
    from nvfp4train.data.inputs import inputs_fingerprint
    from nvfp4train.data.prepare import _cache_split_dir
    from nvfp4train.data.tokenizer import load_tokenizer

    data = load("train", ["model=hybrid_tiny", f"data.cache_dir={cache}"]).data
    name, src = next(iter(data.sources.items()))
    fingerprint = inputs_fingerprint(src.train, src.text_field, src.format, f"data.sources.{name}.train")
    out = _cache_split_dir(data, load_tokenizer(data.tokenizer).identity, name, "train", fingerprint)
    return out.parent / f".{out.name}.lock"


def test_sigterm_while_waiting_for_another_process_preparing_shards_stops_in_one_line(tmp_path, spawn):
    """Another process holds the shard directory's lock (it is preparing the shards): the trainer waiting for
    it stops on SIGTERM within seconds, with the start-up line, and trusts no shard."""
    cache = tmp_path / "cache"
    lock_path = _lock_of_first_source(cache)
    lock_path.parent.mkdir(parents=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = _start(spawn, tmp_path / "run", "train.max_steps=5", f"data.cache_dir={cache}")
        deadline = time.monotonic() + 120
        while f" {proc.pid} " not in "".join(
            line for line in Path("/proc/locks").read_text().splitlines(True) if "->" in line
        ):  # blocked on the lock
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 15
    assert proc.returncode == 0 and stderr.strip() == "received SIGTERM before the first step: stopped, nothing to save"
    assert not list(cache.rglob("manifest.json")) and not list(cache.rglob("shard_*"))
