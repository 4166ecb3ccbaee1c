"""train.tensorboard=true: metrics.jsonl's numbers as TensorBoard scalars, read back with TensorBoard's own
reader; without the package, one line before anything is written."""

import importlib.util

import pytest

from tests.conftest import read_metrics, run_train

TINY = ["train.max_steps=2", "train.log_every=1", "train.progress=false", "train.seq_len=32",
        "train.global_batch_size=2", "train.eval_sequences=1"]  # fmt: skip


def test_tensorboard_scalars_are_the_jsonl_numbers(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    run_train(f"out_dir={out}", "train.tensorboard=true", *TINY)
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    records = read_metrics(out)
    expected = {}
    for record in records:
        for key, value in record.items():
            if key == "step" or key.startswith("resolved/"):  # the run plan: in config.yaml, not a chart
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(key, {})[record["step"]] = value
    assert set(events.Tags()["scalars"]) == set(expected)
    for key, by_step in expected.items():
        got = {e.step: e.value for e in events.Scalars(key)}
        assert got == pytest.approx(by_step, rel=1e-6), key  # stored as float32
    assert {"loss", "val/literature"} <= set(expected)


def test_tensorboard_without_the_package_is_one_line(tmp_path):
    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    out = tmp_path / "run"
    proc = run_train(f"out_dir={out}", "train.tensorboard=true", *TINY, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: train.tensorboard=true needs the tensorboard package: pip install 'nvfp4train[tensorboard]'"
    ), proc.stderr
    assert not out.exists()
