"""What a resume may change (nvfp4train/train/resume_policy.py), through the real CLI: switching precision
continues with a log line and keeps the previous config.yaml; changing the seed or the batch is refused
with one line before anything is written."""

import shutil

from tests.conftest import run_train

ARGS = [
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
]


def test_switch_precision_then_refuse_a_new_seed_or_batch(tmp_path):
    out = tmp_path / "run"
    run_train(f"out_dir={out}", "train.max_steps=4", "train.save_every=2", *ARGS)
    first_config = (out / "config.yaml").read_text()
    shutil.rmtree(out / "checkpoints" / "step_00000004")  # as if killed after step 2's checkpoint

    resumed = run_train(f"out_dir={out}", "train.max_steps=4", "train.save_every=2", "precision=nvfp4", *ARGS)
    assert "resumed from" in resumed.stdout and "resume changes precision." in resumed.stdout
    assert (out / "config.step_00000002.yaml").read_text() == first_config
    assert "nvfp4" in (out / "config.yaml").read_text()

    before = sorted(p.name for p in out.rglob("*"))
    config = (out / "config.yaml").read_text()
    for change, key in (("seed=7", "seed=7"), ("train.global_batch_size=8", "train.global_batch_size=8")):
        proc = run_train(
            f"out_dir={out}", "train.max_steps=4", "train.save_every=2", "precision=nvfp4", *ARGS, change, check=False
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {key} differs"), proc.stderr
        assert "cannot change on resume" in lines[0]
    assert sorted(p.name for p in out.rglob("*")) == before and (out / "config.yaml").read_text() == config
