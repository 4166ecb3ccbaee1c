"""What a new user meets in the first hour (issue 31): each entry point's --help, training on their own
files, train.log as the full log, one held-out set size, quiet eval/export, CPU threads, the comparison
without matplotlib, `torchrun --standalone` in the docs."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch
from omegaconf import OmegaConf

from nvfp4train.config import CONFIG_DIR, TrainConfig
from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, read_metrics
from tests.e2e.test_optional_imports import run_blocked

TINY = [
    "train.max_steps=3",
    "train.log_every=1",
    "train.seq_len=32",
    "train.global_batch_size=2",
    "train.progress=false",
]


def _run(argv, cwd=REPO, **env):
    return run_and_kill_on_timeout([sys.executable, "-m", *argv], cwd=cwd, env=cli_env(**env), timeout=600)


def test_train_help_is_a_short_usage_text():
    proc = _run(["nvfp4train.train", "--help"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: python -m nvfp4train.train") and len(out.splitlines()) < 40
    assert "powered by Hydra" not in out and "== Config ==" not in out
    groups = dict(re.findall(r"^  (\w+): +(.+)$", out, flags=re.MULTILINE))
    assert set(groups) == {"model", "precision", "data"}  # no `reproduce` group: it is refused
    assert "hybrid_tiny" in groups["model"] and "nvfp4" in groups["precision"] and "own" in groups["data"]
    assert "--cfg job" in out and "train.max_steps" in out and "--standalone" in out


@pytest.mark.parametrize(
    "entry, options",
    [
        ("nvfp4train.eval", ["run_dir=", "heldout_sequences=64", "tasks="]),
        ("nvfp4train.export", ["run_dir=", "dtype=float32", "out="]),
    ],
)
def test_eval_and_export_help_list_their_options(entry, options):
    proc = _run([entry, "--help"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(f"usage: python -m {entry} run_dir=RUN")
    for option in options:
        assert f"\n  {option}" in proc.stdout, (option, proc.stdout)


def test_one_held_out_set_size_for_training_and_eval():
    eval_default = OmegaConf.load(CONFIG_DIR / "eval.yaml").heldout_sequences
    assert TrainConfig().eval_sequences == eval_default == 64


def test_own_data_without_files_is_one_line():
    proc = _run(["nvfp4train.train", "data=own"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: data.sources.own.train: required, no default "
        "(e.g. data.sources.own.train=data/mine.jsonl; see docs/data.md)"
    )


def test_a_source_the_data_config_lacks_points_to_data_own():
    proc = _run(["nvfp4train.train", "data.sources.mine.train=notes.jsonl"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "no source 'mine'" in proc.stderr and "data=own data.sources.own.train=" in proc.stderr


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A run on a user's own files (a jsonl and a text file, named relative to the working directory)."""
    import gzip

    cwd = tmp_path_factory.mktemp("own")
    with gzip.open(REPO / "data/bundled/literature.val.jsonl.gz", "rt") as f:
        docs = [json.loads(line)["text"] for line in f]
    paragraphs = [p for d in docs for p in d.split("\n\n") if len(p) > 200][:60]
    (cwd / "notes.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs[:30]))
    (cwd / "book.txt").write_text("\n\n".join(paragraphs[30:50]))
    (cwd / "held.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs[50:]))
    proc = _run(
        [
            "nvfp4train.train",
            "data=own",
            "data.sources.own.train=[notes.jsonl,book.txt]",
            "data.sources.own.val=held.jsonl",
            "out_dir=runs/own",
            "train.eval_sequences=4",
            *TINY,
        ],
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, cwd / "runs" / "own", proc


def test_own_data_trains_and_holds_out_only_its_source(own_run):
    _, out, proc = own_run
    last = read_metrics(out)[-1]
    assert last["step"] == 3 and sorted(k for k in last if k.startswith("val/")) == ["val/mean", "val/own"]
    assert proc.stdout.strip().splitlines()[-1].startswith("done: step 3, loss ")


def test_train_log_is_the_full_log(own_run):
    _, out, proc = own_run
    log = (out / "train.log").read_text()
    for step in (1, 2, 3):
        assert re.search(rf"nvfp4train.train INFO: step {step} loss \d+\.\d{{4}} ", log), log
    assert "held-out loss at step 3 (in training, training precision, up to 4 sequences per source): own " in log
    assert log.rstrip().endswith(proc.stdout.strip().splitlines()[-1])  # the done line, last


def test_eval_and_export_print_no_torch_warning(own_run):
    cwd, out, _ = own_run
    proc = _run(
        ["nvfp4train.eval", f"run_dir={out}", "tasks=arithmetic", "max_items=2", "heldout_sequences=4", "batch_size=2"],
        cwd=cwd,
    )
    # stderr holds eval's progress lines only: no warning of torch's
    assert proc.returncode == 0 and proc.stderr.splitlines() == [
        "eval: held-out loss (bf16, up to 4 sequences of own) ...",
        "eval: task arithmetic (1/1, 2 items) ...",
    ], proc.stderr
    result = json.loads((out / "eval.json").read_text())
    assert list(result["heldout"]) == ["own"] and result["heldout_sequences"] == 4
    proc = _run(["nvfp4train.export", f"run_dir={out}", f"out={cwd / 'export'}"], cwd=cwd)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_compare_without_matplotlib_writes_the_tables_and_says_so_once(own_run, tmp_path):
    _, out, _ = own_run
    proc = run_blocked(
        """
        import runpy, sys
        sys.argv = sys.argv[1:]
        runpy.run_module("nvfp4train.compare", run_name="__main__", alter_sys=True)
    """,
        "nvfp4train.compare",
        str(out),
        "--out",
        str(tmp_path / "cmp"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip() == (
        "no figures: drawing them needs matplotlib: pip install 'nvfp4train[plots]' "
        "(compare.md and compare.json are written; --no-plots skips figures)"
    )
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["compare.json", "compare.md"]


def test_running_elsewhere_reads_the_processes_running_now():
    from nvfp4train.train import build

    assert build.running_elsewhere(samples=2, interval_s=0) >= 0


def test_cpu_threads_leave_busy_cores_alone(monkeypatch):
    from nvfp4train.train import build

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    try:
        monkeypatch.setattr(build, "running_elsewhere", lambda: 3)
        monkeypatch.setattr(os, "getloadavg", lambda: (2.6, 1.0, 1.0))
        assert build.cpu_threads() == (
            " (1 of 4 cores: load average 2.6, 3 other processes running; OMP_NUM_THREADS=N to choose)"
        )
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 1.0, 1.0))
        assert build.cpu_threads().startswith(" (1 of 4 cores") and torch.get_num_threads() == 1
        monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 1.0, 1.0))
        assert build.cpu_threads() == " (4 threads)" and torch.get_num_threads() == 4
        # just after `pip install`: the 1-minute average still counts pip, but nothing else runs any more
        monkeypatch.setattr(os, "getloadavg", lambda: (1.8, 1.0, 1.0))
        monkeypatch.setattr(build, "running_elsewhere", lambda: 0)
        assert build.cpu_threads() == " (4 threads)" and torch.get_num_threads() == 4
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        torch.set_num_threads(3)
        assert build.cpu_threads() == " (3 threads: OMP_NUM_THREADS)" and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# Page faults of a loop that makes and frees a 64 MiB tensor (above glibc's largest mmap threshold, as the
# default run's FP32 logits are), over its last 10 of 20 rounds: the first rounds grow the heap.
FAULTS_OF_FRESH_TENSORS = """
import resource, sys, torch
from nvfp4train.train.build import reuse_freed_host_memory
assert reuse_freed_host_memory() if sys.argv[1] == "reuse" else True
x = torch.ones(16 << 20)
for i in range(20):
    if i == 10:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = x * 2
    del y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_cpu_runs_reuse_freed_memory_instead_of_faulting_it_in_again():
    def faults(mode: str) -> int:
        proc = run_and_kill_on_timeout(
            [sys.executable, "-c", FAULTS_OF_FRESH_TENSORS, mode], cwd=REPO, env=cli_env(), timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return int(proc.stdout.split()[-1])

    # glibc's default maps each one fresh and the kernel faults in every page again (at least one a 2 MiB
    # huge page); kept for reuse, its pages are already there (a loaded machine once faulted one tensor's
    # pages in again, 16384 of the default's 163850: not every step's)
    fresh, reused = faults("default"), faults("reuse")
    assert fresh >= 10 * 32 and reused < fresh / 4, (fresh, reused)
    # a user who tunes malloc keeps their settings
    proc = run_and_kill_on_timeout(
        [sys.executable, "-c", "from nvfp4train.train.build import reuse_freed_host_memory as r; print(r())"],
        cwd=REPO,
        env=cli_env(MALLOC_MMAP_THRESHOLD_="1000000"),
        timeout=120,
    )
    assert proc.stdout.split()[-1] == "False", proc.stderr[-2000:]


def test_lm_eval_adapter_without_lm_eval_is_one_line():
    proc = run_blocked("""
        import runpy, sys
        runpy.run_module("nvfp4train.eval.lm_eval_adapter", run_name="__main__", alter_sys=True)
    """)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("pip install 'nvfp4train[lm-eval]'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_torchrun_lines_in_docs_and_scripts_are_standalone_or_rendezvous():
    """Two users on one machine collide on torchrun's default port 29500 without --standalone."""
    paths = [
        *(REPO / "docs").glob("*.md"),
        *(REPO / "slurm").glob("*.sbatch"),
        *(REPO / "scripts").glob("*.sh"),
        REPO / "nvfp4train" / "train" / "__main__.py",
    ]
    checked = 0
    for path in paths:
        for line in path.read_text().splitlines():
            if re.search(r"\btorchrun\b.*--nproc_per_node", line):
                checked += 1
                assert "--standalone" in line or "--nnodes" in line, f"{path.relative_to(REPO)}: {line.strip()}"
    assert checked >= 3
