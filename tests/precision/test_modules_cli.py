"""precision.modules from the command line: the documented override trains, a bad rule is one line and exit 2 before
anything is written (train/__main__.py checks and composes the overrides before Hydra runs the job)."""

import pytest

from tests.conftest import run_train

QUICK = ["model=hybrid_0p5m", "train.max_steps=1", "train.seq_len=32", "train.global_batch_size=2"]
QUICK += ["train.eval_sequences=0", "train.progress=false"]


@pytest.mark.parametrize(
    "rule, message",
    [
        ("+precision.modules={*.in_proj: bf17}", "error: precision.modules.*.in_proj='bf17': no such precision preset"),
        (
            "+precision.modules={blocks.12.*: bf16}",
            "error: precision.modules.blocks.12.*: the pattern matches no linear",
        ),
    ],
)
def test_a_bad_rule_exits_2_with_one_line_and_writes_nothing(tmp_path, rule, message):
    out = tmp_path / "run"
    proc = run_train(f"out_dir={out}", "precision=nvfp4", rule, *QUICK, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr[-3000:]
    assert not out.exists()


def test_the_documented_override_trains(tmp_path):
    out = tmp_path / "run"
    run_train(
        f"out_dir={out}", "precision=nvfp4", "+precision.modules={*.in_proj: bf16, blocks.3.*: fp8_blockwise}", *QUICK
    )
    log = (out / "train.log").read_text()
    assert "precision.modules: *.in_proj -> bf16: 5 linears (blocks.{0,2,4,8,10}.mixer.in_proj)" in log
