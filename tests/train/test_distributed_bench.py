"""benchmarks/bench_distributed.py end to end on CPU (one tiny run) and bench_comm.py on two gloo ranks:
the rows carry docs/results/bench/train.json's keys and the distributed ones."""

import json
import subprocess
import sys

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env

TRAIN_KEYS = {
    "model",
    "seq",
    "batch",
    "precision",
    "backend",
    "compiled",
    "cuda_graph",
    "step_ms",
    "tokens_per_s",
    "mfu",
    "peak_gib",
    "gpu",
    "commit",
}


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """benchmarks/bench_distributed.py with `args`, on CPU threads of its own."""
    return run_and_kill_on_timeout(
        [sys.executable, "benchmarks/bench_distributed.py", *args],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1),
        timeout=timeout,
    )


def test_bench_distributed_one_run_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    proc = bench(
        *("--device", "cpu", "--model", "hybrid_tiny", "--seq", "32", "--steps", "2", "--runs", "1gpu", "--no-comm"),
        *("--out", str(out), "--work", str(tmp_path / "work")),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert TRAIN_KEYS <= set(row)
    assert row["parallel"] == "single" and row["gpus"] == 1 and row["vs_1gpu"] == 1.0 and row["backend"] == "emulated"
    assert row["tokens_per_s"] > 0 and row["final_loss"] > 0 and "nvfp4train.train" in row["command"]
    assert row["hit_recompile_limit"] is False
    assert row["command"].endswith("train.device=cpu out_dir=OUT")  # the whole command, its last override included
    assert "| 1gpu | 1 |" in proc.stdout
    assert not (tmp_path / "work" / "1gpu").exists()  # each run's directory is removed after it


def test_bench_comm_two_gloo_ranks(tmp_path):
    out = tmp_path / "comm.json"
    proc = run_and_kill_on_timeout(
        [
            sys.executable,
            "-m",
            "nvfp4train.launch",
            "--standalone",
            "--nproc_per_node=2",
            "benchmarks/bench_comm.py",
            "--device",
            "cpu",
            "--model",
            "hybrid_tiny",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    whats = [r["what"] for r in data["rows"]]
    assert any("largest block" in w for w in whats) and any("root" in w for w in whats)
    for r in data["rows"]:
        assert r["bus_gbytes"] == round(r["alg_gbytes"] / 2, 2) or abs(r["bus_gbytes"] - r["alg_gbytes"] / 2) < 0.02


def test_bench_distributed_deadline_stops_and_prints_the_rest(tmp_path):
    """--deadline: the run under way is stopped at it (with its ranks), later runs do not start, and the
    command for them is printed; nothing is merged for a run that did not end."""
    out = tmp_path / "rows.json"
    args = ["--device", "cpu", "--model", "hybrid_tiny", "--seq", "32", "--steps", "200", "--out", str(out)]
    proc = bench(*args, "--runs", "ddp", "fsdp2", "--deadline", "4", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| ddp | 2 | failed: timed out after 4 s at --deadline |" in proc.stdout, proc.stdout
    assert "not started by --deadline 4 s: fsdp2 bench_comm; to run them:" in proc.stdout
    rest = proc.stdout.strip().splitlines()[-1].split()
    assert rest[:2] == ["python", "benchmarks/bench_distributed.py"] and rest[-2:] == ["--runs", "fsdp2"]
    assert " ".join(args) in " ".join(rest) and "--no-comm" not in rest  # bench_comm was left out too
    assert not out.exists()


def test_multi_gpu_runs_are_compared_with_the_one_gpu_run_of_their_precision():
    import benchmarks.bench_distributed as bd

    assert bd.one_gpu_run("ddp") == bd.one_gpu_run("zero2") == bd.one_gpu_run("fsdp2") == "1gpu"
    assert bd.one_gpu_run("nvfp4_fsdp2") == "nvfp4_1gpu" and bd.one_gpu_run("te_fsdp2") == "te_1gpu"
    rows = [
        {"run": "1gpu", "tokens_per_s": 100.0},
        {"run": "nvfp4_fsdp2", "tokens_per_s": 150.0},
        {"run": "ddp", "tokens_per_s": 190.0},
        {"run": "te_fsdp2", "tokens_per_s": 120.0},
        {"run": "zero1", "error": "exit code 1", "seconds": 3.0},
    ]
    earlier = {"nvfp4_1gpu": (80.0, "abc1234")}  # an earlier invocation's row on the same GPU model
    done = bd.finished_rows(rows, earlier)
    assert [(r["run"], r["vs_1gpu"]) for r in done] == [
        ("1gpu", 1.0),
        ("nvfp4_fsdp2", 1.875),
        ("ddp", 1.9),
        ("te_fsdp2", None),  # no te_1gpu row anywhere: no ratio against another precision's run
    ]
    assert bd.baseline("te_fsdp2", rows, earlier) == (None, "no te_1gpu row")
    assert bd.baseline("nvfp4_fsdp2", rows, earlier) == (80.0, "nvfp4_1gpu of commit abc1234 in --out")


def test_graphed_ddp_runs_time_their_replays(tmp_path):
    """A run that captures DDP's step runs eagerly to step 11: it runs at least 30 steps, so that the timed
    second half is replays; the others run --steps."""
    import argparse

    import benchmarks.bench_distributed as bd

    args = argparse.Namespace(
        steps=14, gpus=2, model="hybrid_1b", seq=4096, batch=8, micro=4, device="cuda", profile=tmp_path
    )
    for name, steps in (
        ("nvfp4_ddp_graph", 30),
        ("ddp_graph", 30),
        ("fp8_fsdp2_graph", 30),
        ("nvfp4_ddp", 14),
        ("1gpu", 14),
    ):
        cmd = " ".join(bd.command(name, tmp_path / name, args))
        assert f"train.max_steps={steps + bd.PROFILED_STEPS} " in cmd and f"train.profile_start={steps + 1} " in cmd
    args.steps = 40
    assert bd.timed_steps("nvfp4_ddp_graph", args) == 40


def test_rows_of_two_gpu_models_are_both_kept(tmp_path):
    import benchmarks.bench_distributed as bd

    path = tmp_path / "rows.json"
    row = {"model": "hybrid_1b", "seq": 4096, "batch": 8, "precision": "bf16", "run": "ddp", "gpus": 2}
    bd.merge_rows(path, [{**row, "gpu": "NVIDIA H100 80GB HBM3", "tokens_per_s": 1.0}])
    bd.merge_rows(path, [{**row, "gpu": "NVIDIA H200", "tokens_per_s": 2.0}])
    bd.merge_rows(path, [{**row, "gpu": "NVIDIA H200", "tokens_per_s": 3.0}])  # the same GPU model: replaced
    assert sorted((r["gpu"], r["tokens_per_s"]) for r in json.loads(path.read_text())) == [
        ("NVIDIA H100 80GB HBM3", 1.0),
        ("NVIDIA H200", 3.0),
    ]


def test_bench_distributed_profile_runs_past_the_timed_steps(tmp_path):
    out, prof = tmp_path / "rows.json", tmp_path / "prof"
    args = ["--device", "cpu", "--model", "hybrid_tiny", "--seq", "32", "--steps", "2", "--runs", "1gpu", "--no-comm"]
    proc = bench(*args, "--out", str(out), "--profile", str(prof))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "profile of steps 3-4 (2 steps), rank 0 of the run" in proc.stdout  # after the 2 timed steps
    assert sorted(p.name for p in prof.iterdir()) == ["1gpu_summary.txt", "1gpu_trace_rank0.json"]
    (row,) = json.loads(out.read_text())
    assert "train.profile_start=3" in row["command"] and row["tokens_per_s"] > 0
