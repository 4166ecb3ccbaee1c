"""DeepSpeed ZeRO-1 and ZeRO-2 on two gloo ranks against DDP: the same global batches, the same initial
weights, torch's AdamW inside DeepSpeed (`torch_adam`, no JIT-built op): the loss curves agree within the
rounding of DeepSpeed's BF16 weights (the PyTorch engine computes from FP32 masters under autocast) and
of the gradient reductions' order."""

import pytest

from nvfp4train.train.engines import deepspeed_arch_list
from tests.conftest import read_metrics, run_torchrun

STEPS = 50
COMMON = [
    f"train.max_steps={STEPS}",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "train.seq_len=64",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=0",
    "train.save_every=0",
]


@pytest.mark.parametrize(
    "current, expected",
    [
        (None, "9.0"),
        ("", "9.0"),
        ("9.0a", "9.0"),
        ("8.0;9.0a+PTX", "8.0;9.0+PTX"),
        ("9.0 9.0a 10.0f", "9.0;10.0"),
        ("8.6", "8.6"),
    ],
)
def test_deepspeed_arch_list_is_parsable(current, expected):
    assert deepspeed_arch_list(current, (9, 0)) == expected
    for entry in deepspeed_arch_list(current, (9, 0)).split(";"):  # what DeepSpeed's builder does with it
        major, minor = entry.replace("+PTX", "").split(".")
        int(major), int(minor)


def _torchrun(out, *extra):
    run_torchrun(f"out_dir={out}", *COMMON, *extra, timeout=900)
    return [r["loss"] for r in read_metrics(out) if "loss" in r]


def test_zero1_and_zero2_match_ddp_over_50_steps(tmp_path):
    pytest.importorskip("deepspeed")
    ddp = _torchrun(tmp_path / "ddp")
    zero1 = _torchrun(tmp_path / "zero1", "train.parallel=deepspeed", "train.zero_stage=1")
    zero2 = _torchrun(tmp_path / "zero2", "train.parallel=deepspeed", "train.zero_stage=2")
    assert len(ddp) == len(zero1) == len(zero2) == STEPS
    # Measured on this CPU (2 cores): step 1 within 1.4e-6; over 50 steps ZeRO-1 vs DDP within 1.6e-3, ZeRO-2
    # vs DDP 2.0e-3, ZeRO-2 vs ZeRO-1 2.5e-3 (ZeRO-2 reduce-scatters in buckets during backward, ZeRO-1
    # all-reduces after it: a different summation order, amplified by training like any rounding difference).
    for zero in (zero1, zero2):
        assert zero[0] == pytest.approx(ddp[0], rel=1e-5)
        assert zero == pytest.approx(ddp, rel=5e-3)
    assert zero1[-1] < zero1[0] - 0.5  # and it trains
