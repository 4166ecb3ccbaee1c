"""A run's bad input under torchrun: one line on the terminal and a non-zero exit.

Stock torchrun: rank 0 prints the line once and every rank records it in torchrun's error file, so
torchrun's summary shows it instead of "To enable traceback see ..." (torchrun's own traceback of its
ChildFailedError stays: stock torchrun always prints one). `python -m nvfp4train.launch`, torchrun with
the same options, prints only the line and exits with the worker's code."""

import sys

import pytest

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, read_metrics, run_torchrun

TINY = ["train.max_steps=2", "train.global_batch_size=4", "train.seq_len=32", "train.progress=false"]
# passes the config check; the trainer refuses it on every rank after the process group is up
REFUSED_BY_TRAINER = ["model.vocab_size=100"]
LINE = "error: model.vocab_size=100 is smaller than the tokenizer's"


def _launch(launcher: str, out, *overrides, timeout=300):
    return run_torchrun(f"out_dir={out}", *TINY, *overrides, launcher=launcher, timeout=timeout, check=False)


def test_launcher_prints_one_line_and_the_workers_exit_code(tmp_path):
    proc = _launch("nvfp4train.launch", tmp_path / "run", *REFUSED_BY_TRAINER)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(LINE), lines
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_launcher_refuses_a_bad_value_before_starting_workers(tmp_path):
    proc = _launch("nvfp4train.launch", tmp_path / "run", "train.zero_stage=3", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: train.zero_stage=3") and "[1, 2]" in proc.stderr
    assert "Rendezvous" not in proc.stderr and not (tmp_path / "run").exists()


def test_the_readme_launcher_names_a_global_batch_that_fits_three_ranks(tmp_path):
    """README's multi-process line (nvfp4train.launch) on 3 ranks with the default global batch of 16: the one
    line names the batch sizes that fit, before any worker starts."""
    out = tmp_path / "run"
    proc = run_torchrun(f"out_dir={out}", "train.parallel=fsdp2", nproc=3, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: train.global_batch_size=16 is not a multiple of the world size 3: set train.global_batch_size=15 "
        "or train.global_batch_size=18 (each rank then takes global/3 sequences a step)"
    ]
    assert not out.exists()


def test_stock_torchrun_shows_the_line_once_and_in_its_summary(tmp_path):
    proc = _launch("torch.distributed.run", tmp_path / "run", *REFUSED_BY_TRAINER)
    assert proc.returncode != 0
    lines = proc.stderr.splitlines()
    assert sum(line.startswith(LINE) for line in lines) == 1, proc.stderr[-3000:]  # rank 0's, not one per rank
    # torchrun's failure summary: the worker's line from its error file, not "To enable traceback see"
    assert any(line.strip().startswith("traceback : " + LINE) for line in lines), proc.stderr[-3000:]
    assert "To enable traceback" not in proc.stderr


def test_eval_sequences_zero_means_no_evaluation(tmp_path):
    """train.eval_sequences=0 (as Megatron's --eval-iters 0): the run trains and logs no held-out loss."""
    proc = run_and_kill_on_timeout(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            f"out_dir={tmp_path / 'run'}",
            *TINY,
            "train.eval_sequences=0",
            "train.log_every=1",
        ],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert not any(key.startswith("val/") for r in records for key in r)


@pytest.mark.parametrize("argv, code", [(["-m", "nvfp4train.train", "train.zero_stage=3"], 2)])
def test_precheck_names_the_key(argv, code):
    from nvfp4train.launch.torchrun import precheck

    line = precheck(argv[2:])
    assert line is not None and line.startswith("error: train.zero_stage=3")
    assert precheck(["train.max_steps=3"]) is None
