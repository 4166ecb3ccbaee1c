"""What a resume may change (nvfp4train/train/resume_policy.py), through the real CLI: extending the run
and switching precision continue with a log line and keep the previous config.yaml; changing the seed
or the batch is refused with one line before anything is written."""
from tests.conftest import run_train

ARGS = ["train.progress=false", "train.eval_sequences=2", "train.seq_len=32", "train.global_batch_size=4",
        "train.micro_batch_size=4", "train.log_every=1"]


def test_extend_and_switch_precision_then_refuse_a_new_seed(tmp_path):
    out = tmp_path / "run"
    run_train(f"out_dir={out}", "train.max_steps=2", *ARGS)
    first_config = (out / "config.yaml").read_text()

    # the bundled blend draws its sources from a permutation of the whole run, so a longer run would
    # have drawn other sources for the samples already consumed: one line, not a traceback
    proc = run_train(f"out_dir={out}", "train.max_steps=4", *ARGS, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: ") and "cannot be extended exactly" in lines[-1]
    assert sum(line.startswith("error: ") for line in lines) == 1 and "Traceback" not in proc.stderr

    resumed = run_train(f"out_dir={out}", "train.max_steps=2", "train.save_every=1", "precision=nvfp4", *ARGS)
    assert "resumed from" in resumed.stdout and "resume changes precision." in resumed.stdout
    assert (out / "config.step_00000002.yaml").read_text() == first_config
    assert "nvfp4" in (out / "config.yaml").read_text()

    before = sorted(p.name for p in out.rglob("*"))
    config = (out / "config.yaml").read_text()
    for change, key in (("seed=7", "seed=7"), ("train.global_batch_size=8", "train.global_batch_size=8")):
        proc = run_train(f"out_dir={out}", "train.max_steps=2", "precision=nvfp4", *ARGS, change, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {key} differs"), proc.stderr
        assert "cannot change on resume" in lines[0]
    assert sorted(p.name for p in out.rglob("*")) == before and (out / "config.yaml").read_text() == config
