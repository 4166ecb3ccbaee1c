"""The sbatch scripts under preemption, end to end on CPU.

SLURM sends SIGUSR1 to the batch shell (`--signal=B:USR1@180`). The script must pass SIGTERM to the
training step, let every rank save a checkpoint, call `scontrol requeue <job id>` exactly once and exit
0, although torchrun itself exits non-zero after a SIGTERM. `scontrol` here is a stand-in on PATH that
records its arguments (the only part of SLURM that cannot run on this machine); torchrun and the
training ranks are real.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, read_metrics

ARGS = [
    "train.max_steps=100000",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
]


def _stand_ins(bin_dir: Path, calls: Path) -> None:
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"""#!/bin/bash
echo "$@" >> {calls}
if [[ $1 == show && $2 == hostnames ]]; then echo localhost; fi
""")
    # srun on one node: run the step it is given, as srun would with one task.
    srun = bin_dir / "srun"
    srun.write_text("""#!/bin/bash
while [[ $1 == --* ]]; do shift; done
exec "$@"
""")
    for f in (scontrol, srun):
        f.chmod(0o755)


@pytest.fixture
def stand_ins(tmp_path):
    """(file recording scontrol's calls, PATH with the stand-ins and this Python's torchrun first)."""
    calls = tmp_path / "scontrol_calls"
    _stand_ins(tmp_path / "bin", calls)
    path = os.pathsep.join([str(tmp_path / "bin"), os.path.dirname(sys.executable), os.environ["PATH"]])
    if shutil.which("torchrun", path=path) is None:
        pytest.skip("torchrun is not on PATH next to this Python")
    return calls, path


@pytest.mark.parametrize("script", ["single_node.sbatch", "multi_node.sbatch", "ab_array.sbatch"])
def test_usr1_checkpoints_requeues_once_and_exits_zero(tmp_path, stand_ins, script, spawn):
    calls, path = stand_ins
    env = cli_env(
        SLURM_JOB_ID=777,
        SLURM_JOB_NODELIST="localhost",
        SLURM_NNODES=1,
        SLURM_ARRAY_TASK_ID=0,
        NPROC_PER_NODE=1,
        OMP_NUM_THREADS=1,
        PATH=path,
        EXPERIMENT="slurmtest",
    )
    out = tmp_path / "run"
    proc = spawn(
        ["bash", f"slurm/{script}", *ARGS, f"out_dir={out}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.time()
    while not (out / "metrics.jsonl").exists() or len(read_metrics(out)) < 2:
        assert proc.poll() is None, proc.communicate(timeout=60)[1][-3000:]
        assert time.time() - t0 < 300, "training never logged a step"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGUSR1)  # the batch shell only, as --signal=B: does
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr, stderr[-3000:]  # not torchrun's wall
    requeues = [line for line in calls.read_text().splitlines() if line.startswith("requeue")]
    assert requeues == ["requeue 777"]
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    assert len(ckpts) == 1 and not ckpts[0].name.endswith(".tmp")
    assert read_metrics(out)[-1]["step"] == int(ckpts[0].name[len("step_") :])


def test_training_failure_is_the_job_status_and_never_requeues(tmp_path, stand_ins):
    """Without a preemption signal the step's own exit status is the job's, and nothing is requeued."""
    calls, path = stand_ins
    env = cli_env(SLURM_JOB_ID=778, SLURM_JOB_NODELIST="localhost", NPROC_PER_NODE=1, OMP_NUM_THREADS=1, PATH=path)
    proc = run_and_kill_on_timeout(
        ["bash", "slurm/single_node.sbatch", "train.max_steps=-1", f"out_dir={tmp_path / 'r'}"],
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode != 0
    assert not calls.exists() or "requeue" not in calls.read_text()
