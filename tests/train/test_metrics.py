"""metrics.jsonl is strict JSON (jq, JavaScript): a skipped step's non-finite loss is written as null,
with the step's step_skipped flag kept; resume still cuts the file back to the checkpoint's step."""

import json
import math

from nvfp4train.train.metrics import MetricsLogger


def strict_records(path):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_nonfinite_numbers_are_written_as_null(tmp_path):
    logger = MetricsLogger(tmp_path, enabled=True)
    logger.open(resume_step=None)
    logger.log({"step": 1, "loss": 2.5, "grad_norm": 0.5, "step_skipped": False})
    logger.log({"step": 2, "loss": math.nan, "grad_norm": math.inf, "lr": 1e-3, "step_skipped": True})
    logger.log({"step": 3, "loss": 2.25, "grad_norm": -math.inf, "step_skipped": False})
    logger.close()
    records = strict_records(tmp_path / "metrics.jsonl")
    assert records[1] == {"step": 2, "loss": None, "grad_norm": None, "lr": 1e-3, "step_skipped": True}
    assert records[0]["loss"] == 2.5 and records[2]["grad_norm"] is None

    logger = MetricsLogger(tmp_path, enabled=True)
    logger.open(resume_step=2)  # resumed from the step-2 checkpoint
    logger.close()
    assert [r["step"] for r in strict_records(tmp_path / "metrics.jsonl")] == [1, 2]
