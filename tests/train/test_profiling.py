"""train.profile_start / train.profile_steps: torch.profiler over a window of optimizer steps, a chrome trace
per rank and rank 0's summary in out_dir/profile/ (train/profiling.py); the kinds of kernel the summary and
benchmarks/bench_train.py --profile share."""

import json

from nvfp4train.train.profiling import kernel_kind
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
    assert names == ["summary.txt", "trace_rank0.json", "trace_rank1.json"]


def test_kernel_kinds_of_real_kernel_names():
    assert kernel_kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert kernel_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication"
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "communication"
    assert kernel_kind("_rht_rows_kernel") == "quantize (ours)"
