import math

import pytest

from nvfp4train.optim import ScheduleConfig, lr_at
from nvfp4train.optim.schedules import DECAY_STYLES, decay_coefficient


@pytest.mark.parametrize("style", DECAY_STYLES)
def test_wsd_warmup_constant_then_decay_to_min(style):
    cfg = ScheduleConfig(name="wsd", warmup_steps=10, decay_fraction=0.2, decay_style=style)
    lrs = [lr_at(s, 100, 1.0, 0.01, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)  # linear warmup
    assert all(lr == 1.0 for lr in lrs[10:80])  # stable phase
    assert all(a >= b for a, b in zip(lrs[80:], lrs[81:]))  # monotone decay
    assert lrs[80] < 1.0 and lrs[-1] == pytest.approx(0.01)  # reaches min_lr


def test_decay_shapes_match_megatron_formulas():
    r = 0.25
    assert decay_coefficient("linear", r) == pytest.approx(0.75)
    assert decay_coefficient("cosine", r) == pytest.approx(0.5 * (math.cos(math.pi * r) + 1))
    assert decay_coefficient("exponential", r) == pytest.approx(2 * 0.5**r - 1)
    assert decay_coefficient("minus_sqrt", r) == pytest.approx(0.5)


def test_cosine_schedule_and_bad_names():
    cfg = ScheduleConfig(name="cosine", warmup_steps=0)
    assert lr_at(0, 100, 1.0, 0.0, cfg) == pytest.approx(1.0)
    assert lr_at(50, 100, 1.0, 0.0, cfg) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="decay_style"):
        ScheduleConfig(decay_style="quadratic")
    with pytest.raises(ValueError, match="name"):
        ScheduleConfig(name="step")
