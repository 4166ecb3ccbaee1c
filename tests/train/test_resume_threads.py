"""A CPU run's thread count changes its last bits (a matmul's reduction is split among the threads), and the
trainer picks the count from the machine's load: a resumed run takes the count its checkpoint recorded, so
that it repeats the uninterrupted run bit for bit whatever the load is when it resumes."""

import json
import shutil

import torch

from nvfp4train.train.build import resume_cpu_threads
from tests.conftest import REPO, cli_env, read_metrics, run_and_kill_on_timeout, train_cmd

COMMON = [
    "train.max_steps=4",
    "train.save_every=2",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=0",
    "train.seq_len=64",
    "train.global_batch_size=8",
]


def _train(out, env):
    proc = run_and_kill_on_timeout(train_cmd(f"out_dir={out}", *COMMON), cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_resume_takes_the_checkpoints_thread_count_and_repeats_the_run(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _train(full, cli_env(OMP_NUM_THREADS="2"))
    assert json.loads((full / "checkpoints" / "step_00000002" / "meta.json").read_text())["cpu_threads"] == 2
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "step_00000004")
    env = cli_env()
    env.pop("OMP_NUM_THREADS", None)  # the load decides a fresh run's count; the resume must not let it
    resumed = _train(cut, env)
    assert "(2 threads: as the run being resumed)" in resumed.stdout
    a = [r["loss"] for r in read_metrics(full) if "loss" in r]
    b = [r["loss"] for r in read_metrics(cut) if "loss" in r]
    assert len(a) == len(b) == 4 and a == b


def test_a_chosen_thread_count_is_kept_and_a_difference_said(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", str(before))
        assert resume_cpu_threads(before) == (None, None)
        banner, note = resume_cpu_threads(before + 1)
        assert banner is None and torch.get_num_threads() == before
        assert note.startswith(f"CPU threads: {before} (OMP_NUM_THREADS), the checkpoint's run used {before + 1}")
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert resume_cpu_threads(None) == (None, None)  # a checkpoint from before the count was recorded
        assert resume_cpu_threads(True) == (None, None)
        assert resume_cpu_threads(1) == (" (1 thread: as the run being resumed)", None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
