"""benchmarks/bench_nvfp4_pair.py runs on CPU (its kernels in Triton's interpreter) and refuses a bad shape."""

from tests.bench import run_benchmark


def test_cpu_run_prints_a_row_per_case_and_shape():
    proc = run_benchmark("bench_nvfp4_pair", "--shapes", "32x32", "64x48")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [" ".join(r[:-1]) for r in rows] == [
        f"{case} {shape}" for shape in ("32x32", "64x48") for case in ("x rne", "dy sr", "copy", "transposing copy")
    ]
    assert all(float(r[-1]) > 0 for r in rows)


def test_a_shape_not_of_multiples_of_16_is_refused_in_one_line():
    proc = run_benchmark("bench_nvfp4_pair", "--shapes", "40x32")
    assert proc.returncode != 0 and "TOKENSxFEATURES, both multiples of 16" in proc.stderr
    assert "Traceback" not in proc.stderr
