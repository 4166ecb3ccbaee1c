import math

import pytest

from nvfp4train.train.guards import NonFiniteGuard, SpikeDetector, TrainingHalted


def test_nonfinite_steps_are_skipped_then_halt():
    guard = NonFiniteGuard(max_in_row=3)
    assert guard.check(1, 2.0, 1.0)
    assert not guard.check(2, math.nan, 1.0)
    assert not guard.check(3, 2.0, math.inf)
    assert guard.check(4, 2.0, 1.0) and guard.in_row == 0 and guard.total_skipped == 2
    assert not guard.check(5, math.nan, 1.0)
    assert not guard.check(6, math.nan, 1.0)
    with pytest.raises(TrainingHalted, match="step 7: 3 steps in a row"):
        guard.check(7, math.nan, math.nan)


def test_spike_detector_flags_jump_and_keeps_baseline():
    det = SpikeDetector(factor=2.0, warmup=5)
    flags = [det.update(1.0) for _ in range(10)]
    assert not any(flags)
    assert det.update(5.0) and det.spikes == 1
    assert det.ema == pytest.approx(1.0)  # the spike did not move the baseline
    assert not det.update(1.1)
