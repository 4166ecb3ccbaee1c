"""train.profile_start / train.profile_steps: torch.profiler over a window of optimizer steps, a chrome trace
per rank and rank 0's summary in out_dir/profile/ (train/profiling.py); the kinds of kernel the summary and
benchmarks/bench_train.py --profile share."""

import json

import pytest

from nvfp4train.train.profiling import busy_us, gpu_timeline, kernel_kind, launch_lag
from tests.conftest import run_torchrun, run_train


def test_a_run_profiles_its_window_and_trains_on(tmp_path, quick):
    out = tmp_path / "run"
    proc = run_train(*quick, "train.profile_start=3", "train.profile_steps=2", f"out_dir={out}")
    summary = (out / "profile" / "summary.txt").read_text()
    assert summary.startswith("profile of steps 3-4 (2 steps), rank 0 of the run\n"), summary
    assert "wall time per step:" in summary and "CPU time per step" in summary
    assert "profiled steps, per step:" in summary and "top 15 kernels:" in summary and "gemm" in summary
    trace = json.loads((out / "profile" / "trace_rank0.json").read_text())
    assert trace["traceEvents"]
    assert f"profile of steps 3-4: {out / 'profile'}/summary.txt, trace_rank0.json" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("done: step 12")  # training went on to the end
    run_train(*quick, "train.max_steps=14", f"out_dir={out}")  # the profile keys are not part of the run


def test_a_window_past_the_end_is_cut_at_the_last_step_and_off_by_default(tmp_path, quick):
    out = tmp_path / "run"
    run_train(*quick, "train.max_steps=4", "train.profile_start=4", "train.profile_steps=5", f"out_dir={out}")
    assert (out / "profile" / "summary.txt").read_text().startswith("profile of steps 4-4 (1 step)")
    plain = tmp_path / "plain"
    run_train(*quick, "train.max_steps=2", f"out_dir={plain}")
    assert not (plain / "profile").exists()


def test_every_rank_writes_its_trace(tmp_path, quick):
    out = tmp_path / "run"
    run_torchrun(*quick, "train.max_steps=3", "train.profile_start=2", "train.profile_steps=1", f"out_dir={out}")
    names = sorted(p.name for p in (out / "profile").iterdir())
    assert names == ["summary.txt", "summary_rank1.txt", "trace_rank0.json", "trace_rank1.json"]
    assert (out / "profile" / "summary_rank1.txt").read_text().startswith("profile of steps 2-2 (1 step), rank 1 ")


def test_gpu_timeline_splits_a_step_into_compute_communication_alone_and_idle():
    assert busy_us([(0, 10), (5, 15), (20, 30), (22, 25)]) == 25  # overlaps counted once
    assert busy_us([]) == 0
    gemm, nccl = "nvjet_sm90_tst_128x256", "ncclDevKernel_AllGather_RING_LL"
    # 2 steps in 100 ms: compute 0-30 and 40-60 ms on one stream, an all-gather 20-50 ms on another
    activities = [(0, 30_000, gemm), (40_000, 60_000, gemm), (20_000, 50_000, nccl)]
    t = gpu_timeline(activities, wall_ms=100.0, steps=2)
    assert t["running"] == pytest.approx(30.0)  # 0-60 ms, per step
    assert t["compute"] == pytest.approx(25.0)  # the all-gather is hidden behind compute except 30-40 ms
    assert t["communication_alone"] == pytest.approx(5.0)
    assert t["idle"] == pytest.approx(20.0)
    assert t["activities"] == pytest.approx(1.5)


def test_kernel_kinds_of_real_kernel_names():
    assert kernel_kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert kernel_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication"
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "communication"
    assert kernel_kind("_rht_rows_kernel") == "quantize (ours)"


def test_launch_lag_tells_a_host_that_paces_the_device():
    launches = {1: 0.0, 2: 10.0, 3: 20.0, 4: 30.0}  # correlation id -> launch call's start, µs
    waiting = launch_lag(launches, [(1, 5.0), (2, 15.0), (3, 26.0), (4, 5000.0), (9, 1.0)])  # 9: no launch seen
    assert waiting == {"median_ms": pytest.approx(0.006), "near": 0.75, "kernels": 4}
    queued = launch_lag(launches, [(1, 900.0), (2, 1500.0), (3, 2100.0)])
    assert queued["near"] == 0 and queued["median_ms"] == pytest.approx(1.49)
    assert launch_lag({}, [(1, 5.0)]) is None


def test_timeline_lines_read_a_real_profile():
    """The GPU summary's lines from a CPU profile (no device activity): the host's time inside ops is there, the
    rest is empty, and nothing raises (a GPU run's profiling window ends through this code)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nvfp4train.train.profiling import timeline_lines

    a = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            a = torch.tanh(a @ a)
    lines = timeline_lines(prof, wall_ms=50.0, steps=2)
    assert lines[0].startswith("    GPU timeline per step: some kernel running 0.0 ms")
    assert lines[0].endswith("nothing running 25.0 ms; 0 kernels and copies, 0 to host memory")
    assert lines[1] == "    host waits on the GPU per step: none"
    host_ms = float(lines[2].split("inside torch ops ")[1].split(" ms")[0])
    assert host_ms > 0 and lines[2].endswith("(nvfp4train::) 0.0 ms")
    assert len(lines) == 3  # no kernel launches: no lag line


def test_custom_op_host_ranks_our_ops_and_counts_the_launches_inside_them():
    from nvfp4train.train.profiling import custom_op_host

    ops = [
        ("nvfp4train::quant_linear_fprop", 0.0, 300.0),
        ("nvfp4train::quant_linear_fprop", 1000.0, 1300.0),
        ("nvfp4train::rms_norm_triton", 400.0, 500.0),
        ("nvfp4train::quant_linear_dy", 2000.0, 2800.0),
    ]
    launches = [10.0, 250.0, 450.0, 700.0, 1100.0, 2500.0, 5000.0]  # 700 and 5000 are outside every op
    (line,) = custom_op_host(ops, launches, steps=2)
    assert line == (
        "    host per step in our custom ops, by op: quant_linear_dy 0.4 ms x0.5, quant_linear_fprop 0.3 ms x1,"
        " rms_norm_triton 0.1 ms x0.5; 2.5 kernel launches inside them"
    )
    assert custom_op_host([], launches, steps=2) == []


def test_timeline_lines_break_down_a_quantized_linears_custom_ops():
    """A CPU profile of NVFP4 linears' forward and backward: the summary names the four custom ops."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nvfp4train.config import load_preset
    from nvfp4train.precision import PrecisionPolicy, build_linear_factory
    from nvfp4train.train.profiling import timeline_lines

    policy = PrecisionPolicy.from_dict(load_preset("precision", "nvfp4"))
    factory = build_linear_factory(policy, n_blocks=4, seed=0)
    torch.manual_seed(0)
    layer = factory.linear(64, 64, block_index=1, name="fc1")
    x = torch.randn(2, 32, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(x).square().sum().backward()
    lines = timeline_lines(prof, wall_ms=10.0, steps=1)
    by_op = next(line for line in lines if "by op:" in line)
    for op in ("quant_linear_fprop", "quant_linear_dy", "quant_linear_dgrad", "quant_linear_wgrad"):
        assert f"{op} " in by_op and " x1" in by_op
    assert by_op.endswith("; 0 kernel launches inside them")
