"""Data parallelism on CPU with gloo: one rank with gradient accumulation and two DDP ranks see the
same global batches and give the same losses; the SLURM launch path runs under simulated SLURM env."""

import os
import shutil
import subprocess
import sys

import pytest

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, read_metrics, run_torchrun, run_train

COMMON = [
    "train.max_steps=6",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",
]


def _torchrun(out, *extra):
    return run_torchrun(f"out_dir={out}", *COMMON, *extra, launcher="torch.distributed.run")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The single-process run both parallel runs are held against, trained once for the module (read only)."""
    out = tmp_path_factory.mktemp("distributed") / "one"
    run_train(f"out_dir={out}", *COMMON)
    return out


def test_ddp_two_ranks_matches_one_rank_with_accumulation(tmp_path, one_rank):
    _torchrun(tmp_path / "two")
    one = [r["loss"] for r in read_metrics(one_rank)]
    two = [r["loss"] for r in read_metrics(tmp_path / "two")]
    assert len(one) == len(two) == 6
    assert one == pytest.approx(two, rel=1e-4, abs=1e-4)


def test_fsdp2_two_ranks_tracks_one_rank(tmp_path, one_rank):
    """FSDP2 (gloo on CPU) shards the FP32 masters and computes with BF16 copies: the curve stays within
    BF16 noise of the single-process run (which casts the same FP32 weights under autocast)."""
    _torchrun(tmp_path / "fsdp", "train.parallel=fsdp2", "train.save_every=3")
    one = [r["loss"] for r in read_metrics(one_rank)]
    fsdp = [r["loss"] for r in read_metrics(tmp_path / "fsdp")]
    assert len(fsdp) == 6 and fsdp == pytest.approx(one, rel=5e-3)
    # sharded checkpoint: one DCP shard file per rank
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "step_00000006" / "model_optim"
    shards = sorted(p.name for p in checkpoint.glob("*.distcp"))
    assert len(shards) == 2, shards


def test_slurm_single_node_script_runs_two_cpu_ranks(tmp_path):
    env = cli_env(
        SLURM_JOB_ID=4242,
        SLURM_JOB_NODELIST="localhost",
        SLURM_NNODES=1,
        NPROC_PER_NODE=2,
        OMP_NUM_THREADS=1,
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    if shutil.which("torchrun", path=env["PATH"]) is None:
        pytest.skip("torchrun is not on PATH next to this Python")
    out = tmp_path / "slurm"
    proc = run_and_kill_on_timeout(
        ["bash", "slurm/single_node.sbatch", f"out_dir={out}", *COMMON],
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(read_metrics(out)) == 6


def test_plain_srun_environment_is_understood(tmp_path, spawn):
    """Tasks started by `srun` alone carry only SLURM_* variables: two such processes form a group."""
    procs = []
    for rank in range(2):
        env = cli_env(
            SLURM_PROCID=rank,
            SLURM_NTASKS=2,
            SLURM_LOCALID=rank,
            SLURM_JOB_ID=4243,
            SLURM_JOB_NODELIST="localhost",
            OMP_NUM_THREADS=1,
        )
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        procs.append(
            spawn(
                [sys.executable, "-m", "nvfp4train.train", f"out_dir={tmp_path / 'srun'}", *COMMON],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
    assert len(read_metrics(tmp_path / "srun")) == 6
