"""benchmarks/rht_sum_order.py: its butterfly is the reference's matrix, and it runs on a finished run."""

import sys

import torch

from benchmarks.rht_sum_order import butterfly
from nvfp4train.formats import hadamard
from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, run_train


def test_the_butterfly_is_the_reference_matrix_where_no_sum_rounds():
    x = torch.randint(-8, 8, (256, 16), generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for signs in (None, torch.ones(16)):
        ref = hadamard.rht(x, 16, signs, impl="reference")
        assert torch.equal(butterfly(x.float(), hadamard.resolve_signs(16, signs).float()).to(torch.bfloat16), ref)


def test_it_reports_every_quantized_operand_of_a_run(tmp_path):
    run = tmp_path / "run"
    run_train(
        f"out_dir={run}",
        "model=hybrid_tiny",
        "train.max_steps=2",
        "train.progress=false",
        "train.eval_sequences=2",
        "train.seq_len=64",
        "train.global_batch_size=2",
        "train.micro_batch_size=2",
    )
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", "benchmarks.rht_sum_order", str(run), "--seq", "64", "--batch", "2"],
        cwd=REPO,
        env=cli_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| blocks.")]
    assert len(rows) == 2 * 12  # hybrid_tiny M-*-M-: 2 linears a Mamba, MLP and attention block, x and dY each
    assert "lm_head" not in proc.stdout  # the head stays in BF16 in every recipe
    assert "| all | 870400 elements |" in proc.stdout  # 128 tokens x 6800 features of the operands
    assert proc.stdout.splitlines()[-3:] == [
        "| reference | 54 of 54 |",  # TE's golden RHT cases: the reference's sum order reproduces them all
        "| exact sum | 54 of 54 |",
        "| FP32 butterfly | 54 of 54 |",
    ]
