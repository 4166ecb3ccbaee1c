"""benchmarks/bench_rht_butterfly.py on CPU (Triton's interpreter): each kernel's bits are its definition's
(the index order hadamard.rht's, the butterfly rht_sum_order.butterfly's), or it exits naming the kernel."""

import sys

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env


def test_the_four_kernels_match_their_definitions_in_the_interpreter():
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", "benchmarks.bench_rht_butterfly", "--device", "cpu"]
        + ["--shapes", "64x96", "--blocks", "2,32", "--repeats", "1"],
        cwd=REPO,
        env=cli_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line.split(" | ")[2] for line in proc.stdout.splitlines() if line.startswith("| 64x96 |")]
    assert rows == ["index order", "butterfly", "register butterfly", "transposing copy"]


def test_sass_counts_each_kernels_instructions_per_element_without_a_gpu():
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", "benchmarks.bench_rht_butterfly", "--sass"], cwd=REPO, env=cli_env(), timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    per_element = {
        line.split(" | ")[0].strip("| "): float(line.split(" | ")[2])
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| kernel")
    }
    assert list(per_element) == ["index order", "butterfly", "register butterfly", "transposing copy"]
    # the butterfly's 4 additions an element issue fewer instructions than 16 multiply-adds; a copy fewer still
    assert per_element["transposing copy"] < per_element["register butterfly"] < per_element["index order"]
