"""The reproduction runner end to end on CPU: launch (detached workers) -> wait -> poll -> collect -> ingest
-> skip-existing -> report, with a tiny experiment of 2 arms x 1 seed; its one-line refusals; and how many
runs share a GPU, planned against a given free memory (--gpu-free-gib, as a dry run away from the GPU)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from nvfp4train.reproduce.runner import main as reproduce_main
from tests.conftest import REPO, cli_env

TINY_EXPERIMENT = """
description: two arms of the tiny CPU model
tokens: 1536                      # 6 steps x 4 x 64
seeds: [1]
baseline: bf16
base: [model=hybrid_tiny, data=bundled, train.seq_len=64, train.global_batch_size=4, train.log_every=1,
       train.eval_every=3, train.eval_sequences=2, optim.schedule.warmup_steps=1]
arms:
  bf16: [precision=bf16]
  nvfp4: [precision=nvfp4]
eval: [tasks=arithmetic, max_items=4, heldout_sequences=2, batch_size=2]
"""


def reproduce(*args, experiments: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    prefix = ["--experiments-dir", str(experiments)] if experiments else []
    return subprocess.run([sys.executable, "-m", "nvfp4train.reproduce", *prefix, *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_launch_poll_collect_ingest_report(tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.yaml").write_text(TINY_EXPERIMENT)
    runs, out, results = tmp_path / "runs", tmp_path / "out", tmp_path / "results"
    launch = ["launch", "tiny", "--device", "cpu", "--per-gpu", "2", "--runs-dir", str(runs), "--data", "",
              "--skip-existing", str(results / "runs"), "--commit", "abc123"]

    t0 = time.monotonic()
    proc = reproduce(*launch, experiments=experiments)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 60, "launch must return without waiting for the runs"
    assert "tiny/bf16/seed1" in proc.stdout and "tiny/nvfp4/seed1" in proc.stdout
    assert "tokens/param" in proc.stdout and "started 2 run(s) in 2 worker(s)" in proc.stdout

    # A wait that runs out while the runs train (they take seconds to import torch alone): exit 1, and
    # collect leaves the unfinished runs out, one line each.
    cut_off = reproduce("wait", "--runs-dir", str(runs), "--timeout-s", "0.5", "--every", "0.2")
    assert cut_off.returncode == 1, cut_off.stdout + cut_off.stderr
    assert "ran out with 2 run(s) running or queued" in cut_off.stdout
    early = reproduce("collect", "--runs-dir", str(runs), "--out", str(out))
    assert early.returncode == 0 and "nothing finished to collect" in early.stdout and not list(out.iterdir())
    left_out = [line for line in early.stdout.splitlines() if line.startswith("left out")]
    assert len(left_out) == 2 and all("not finished (" in line for line in left_out), early.stdout

    waited = reproduce("wait", "--runs-dir", str(runs), "--timeout-s", "240", "--every", "1", timeout=300)
    assert waited.returncode == 0, waited.stdout + waited.stderr + "".join(
        p.read_text()[-2000:] for p in runs.glob("*/*/seed1/console.log"))
    assert waited.stdout.rstrip().endswith("every run has ended") and "2 done" in waited.stdout
    polled = reproduce("poll", "--runs-dir", str(runs))
    assert polled.returncode == 0 and "2 done" in polled.stdout and "6/6" in polled.stdout, polled.stdout

    collected = reproduce("collect", "--runs-dir", str(runs), "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    assert "left out" not in collected.stdout
    archives = list(out.iterdir())
    assert len(archives) == 1 and archives[0].name.endswith(".tar.gz")
    with tarfile.open(archives[0]) as tar:
        names = sorted(tar.getnames())
    for arm in ("bf16", "nvfp4"):
        for f in ("metrics.jsonl", "config.yaml", "eval.json", "run.json"):
            assert f"tiny/{arm}/seed1/{f}" in names
    assert not any("checkpoint" in n for n in names)

    ingested = reproduce("ingest", str(archives[0]), "--into", str(results / "runs"))
    assert ingested.returncode == 0, ingested.stderr
    run_dir = results / "runs" / "tiny" / "nvfp4" / "seed1"
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "eval.json", "metrics.jsonl", "run.json"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["commit"] == "abc123" and info["gpu"] == "cpu" and info["train_rc"] == 0 and info["eval_rc"] == 0
    assert info["torch"] and info["wall_s"] > 0
    # passes over each source, recorded where the shards were (a report made without them still says it)
    assert info["data_passes"] and all(p > 0 for p in info["data_passes"].values()), info
    again = reproduce("ingest", str(archives[0]), "--into", str(results / "runs"))
    assert "skip tiny/bf16/seed1" in again.stdout and "0 run(s) added" in again.stdout
    (run_dir / "stale.txt").write_text("a file of the run it replaces")
    forced = reproduce("ingest", str(archives[0]), "--into", str(results / "runs"), "--force")
    assert "replaced tiny/nvfp4/seed1" in forced.stdout and "2 run(s) added" in forced.stdout
    assert not (run_dir / "stale.txt").exists() and (run_dir / "metrics.jsonl").is_file()

    relaunch = reproduce(*launch, experiments=experiments)
    assert relaunch.returncode == 0, relaunch.stderr
    assert "skip tiny/bf16/seed1: already in" in relaunch.stdout and "nothing to start" in relaunch.stdout
    other_budget = reproduce(*launch, "--tokens", "3072", "--arms", "bf16", "--seeds", "2", experiments=experiments)
    assert other_budget.returncode == 2 and len(other_budget.stderr.strip().splitlines()) == 1
    for needle in ("tiny/bf16/seed2 is planned at a budget of 3,072 tokens", "tiny/bf16/seed1 (1,536 tokens), "
                   "tiny/nvfp4/seed1 (1,536 tokens)", "--tokens 1536", "--force"):
        assert needle in other_budget.stderr, other_budget.stderr

    # an experiment configured with a budget of its own (as fp8_vs_nvfp4_long) is planned beside those runs
    (experiments / "tiny_long.yaml").write_text(TINY_EXPERIMENT.replace("tokens: 1536 ", "tokens: 3072 "))
    own_budget = reproduce("launch", "tiny_long", "--device", "cpu", "--runs-dir", str(runs), "--data", "",
                           "--skip-existing", str(results / "runs"), "--dry-run", experiments=experiments)
    assert own_budget.returncode == 0 and "tiny_long/bf16/seed1" in own_budget.stdout, own_budget.stderr
    assert "3,072 tokens per run" in own_budget.stdout, own_budget.stdout
    (experiments / "tiny_long.yaml").unlink()

    reported = reproduce("report", "--runs", str(results / "runs"), "--out", str(results), "--no-plots",
                         experiments=experiments)
    assert reported.returncode == 0, reported.stderr
    text = (results / "reproduction.md").read_text()
    assert "## tiny" in text and "nvfp4 vs bf16" in text and "not run" not in text.split("## tiny")[1].split("##")[0]
    assert (results / "tiny" / "compare.json").is_file()


def test_bad_input_is_one_line(tmp_path):
    for args, needle in [(["launch", "no_such_experiment", "--device", "cpu"], "no_such_experiment"),
                         (["launch", "fp8_vs_nvfp4", "--arms", "fp4_typo", "--device", "cpu"], "fp4_typo"),
                         (["ingest", str(tmp_path / "missing.tar.gz")], "missing.tar.gz"),
                         (["collect", "--runs-dir", str(tmp_path)], "--out"),
                         (["launch", "fp8_vs_nvfp4", "--per-gpu", "many", "--dry-run"], "--per-gpu many"),
                         (["wait", "--runs-dir", str(tmp_path), "--every", "0"], "--every 0")]:
        proc = reproduce(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_plan_of_the_paper_experiments_fits_the_budget():
    """Every arm of the experiments sharing _common.yaml's budget composes; --budget-minutes scales that budget so the
    busiest GPU ends in time, keeping the 1.36x arm at 1.36x (a dry run: nothing starts, no data needed)."""
    proc = reproduce("launch", "fp8_vs_nvfp4", "nvfp4_ablations", "mxfp4", "bf16_switch", "--gpus", "8",
                     "--budget-minutes", "20", "--dry-run", "--data", "",
                     "--runs-dir", "/nonexistent/runs")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if "/seed" in line.split()[0]}
    assert len(rows) == 3 * 3 + 5 + 2 + 2
    steps = {key: int(row[4]) for key, row in rows.items()}
    assert len({v for k, v in steps.items() if "1.36x" not in k}) == 1
    base = steps["fp8_vs_nvfp4/nvfp4/seed1"]
    assert steps["mxfp4/mxfp4_1.36x/seed1"] == round(base * 1.36)
    wall = float(proc.stdout.split("estimated wall time: ")[1].split()[0])
    assert 15 < wall <= 20.0
    assert "hybrid_repro 30.89M params (22.50M without embedding" in proc.stdout
    assert "dry run: nothing started" in proc.stdout


# ------------------------------------------------------------------------------------ runs per GPU by memory
THREE_FORMATS = TINY_EXPERIMENT.replace("seeds: [1]", "seeds: [1, 2, 3]").replace(
    "  nvfp4: [precision=nvfp4]", "  fp8_blockwise: [precision=fp8_blockwise]\n  nvfp4: [precision=nvfp4]") + \
    "gib_per_run: {bf16: 6, fp8_blockwise: 7, nvfp4: 9.5}\n"


@pytest.fixture
def three_formats(tmp_path) -> Path:
    """3 seeds each of bf16 (6 GiB a run), fp8_blockwise (7) and nvfp4 (9.5)."""
    (tmp_path / "three.yaml").write_text(THREE_FORMATS)
    return tmp_path


def dry_run(capsys, experiments: Path, *args) -> tuple[int, str, str]:
    rc = reproduce_main(["--experiments-dir", str(experiments), "launch", "three", *args, "--dry-run", "--data", "",
                         "--runs-dir", "/nonexistent/runs"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def plan_rows(out: str) -> list[dict]:
    """The plan table's rows: run, device, slot, GiB."""
    rows = [line.split() for line in out.splitlines() if line.split() and "/seed" in line.split()[0]]
    return [{"run": r[0], "device": r[1], "slot": int(r[2]), "gib": None if r[-1] == "-" else float(r[-1])}
            for r in rows]


def at_once(rows: list[dict]) -> dict[str, float]:
    """Per device: the GiB of the largest run of each slot, summed (what may train at once)."""
    largest: dict[tuple[str, int], float] = {}
    for r in rows:
        largest[r["device"], r["slot"]] = max(largest.get((r["device"], r["slot"]), 0.0), r["gib"])
    totals: dict[str, float] = {}
    for (device, _), gib in largest.items():
        totals[device] = totals.get(device, 0.0) + gib
    return totals


def test_per_gpu_auto_packs_runs_into_the_free_memory(capsys, three_formats):
    """With 40 GiB free (36 to give), the three NVFP4 runs and one FP8 run start at once (35.5 GiB) and the
    rest queue behind them; with 80 GiB free on each of 2 GPUs every run starts at once, spread over both."""
    rc, out, err = dry_run(capsys, three_formats, "--gpus", "1", "--per-gpu", "auto", "--gpu-free-gib", "40")
    assert rc == 0, err
    rows = plan_rows(out)
    assert len(rows) == 9 and {r["gib"] for r in rows} == {9.5, 7.0, 6.0}
    assert "4 slot(s) (--per-gpu auto)" in out and at_once(rows) == {"cuda:0": 35.5}
    assert "cuda:0: 4 run(s) at once, up to 35.5 GiB of its 36.0 (40.0 GiB free less 10% headroom)" in out
    assert {r["slot"] for r in rows if r["gib"] == 9.5} == {0, 1, 2}   # the largest each start at once

    rc, out, err = dry_run(capsys, three_formats, "--gpus", "2", "--per-gpu", "auto", "--gpu-free-gib", "80")
    assert rc == 0, err
    rows = plan_rows(out)
    assert "9 slot(s)" in out and len({(r["device"], r["slot"]) for r in rows}) == 9
    assert all(gib <= 72 for gib in at_once(rows).values()) and len(at_once(rows)) == 2


def test_per_gpu_n_that_does_not_fit_is_refused_with_the_numbers(capsys, three_formats):
    rc, out, err = dry_run(capsys, three_formats, "--gpus", "1", "--per-gpu", "9", "--gpu-free-gib", "70")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert ("--per-gpu 9: cuda:0 would train 9 runs at once, 3 x 6 GiB (bf16) + 3 x 7 GiB (fp8_blockwise) + "
            "3 x 9.5 GiB (nvfp4) = 67.5 GiB, more than its 63.0 GiB (70.0 GiB free less 10% headroom)") in err
    rc, out, err = dry_run(capsys, three_formats, "--gpus", "1", "--per-gpu", "6", "--gpu-free-gib", "70")
    assert rc == 0 and at_once(plan_rows(out))["cuda:0"] <= 63, out + err
    rc, out, err = dry_run(capsys, three_formats, "--gpus", "1", "--per-gpu", "auto", "--gpu-free-gib", "9")
    assert rc == 2 and "three/nvfp4/seed1: its estimate of 9.5 GiB (nvfp4, gib_per_run) does not fit" in err


def test_every_precision_of_the_paper_experiments_has_a_memory_estimate(capsys):
    """--per-gpu auto plans every run of configs/reproduce (a format without an estimate would refuse); a run
    that switches from NVFP4 to BF16 counts as the larger of the two."""
    rc = reproduce_main(["launch", "all", "--gpus", "1", "--per-gpu", "auto", "--gpu-free-gib", "79", "--dry-run",
                         "--data", "", "--runs-dir", "/nonexistent/runs"])
    rows = {r["run"]: r for r in plan_rows(capsys.readouterr().out)}
    assert rc == 0 and len(rows) == 2 * (3 * 3 + 5 + 2 + 2) and all(r["gib"] for r in rows.values())
    assert rows["bf16_switch/switch_full/seed1"]["gib"] == max(rows["fp8_vs_nvfp4/nvfp4/seed1"]["gib"],
                                                               rows["fp8_vs_nvfp4/bf16/seed1"]["gib"])


@pytest.mark.parametrize("table, needle", [
    ("{nvfp5: 9}", "gib_per_run.nvfp5: unknown precision format; allowed: bf16, fp8_blockwise"),
    ("{nvfp4: -1}", "gib_per_run.nvfp4=-1; expected GiB per run, a number > 0"),
    ("9.5", "gib_per_run is 9.5; expected a mapping FORMAT: GiB"),
])
def test_bad_gib_per_run_is_one_line(tmp_path, capsys, table, needle):
    (tmp_path / "tiny.yaml").write_text(TINY_EXPERIMENT + f"gib_per_run: {table}\n")
    rc = reproduce_main(["--experiments-dir", str(tmp_path), "launch", "tiny", "--device", "cpu", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and re.fullmatch(rf"error: {re.escape(str(tmp_path / 'tiny.yaml'))}: {re.escape(needle)}.*\n", err)


def test_git_commit_is_the_checkouts_head():
    """The one commit helper (runner, bench_train, bench_quant): HEAD, `-dirty` with uncommitted changes."""
    from nvfp4train.data.paths import git_commit

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    assert git_commit() == head.stdout.strip() + ("-dirty" if dirty else "")
    assert head.stdout.startswith(git_commit(short=True).removesuffix("-dirty"))


def test_ingested_results_are_not_ignored_by_git():
    """What ingest writes must be committable: a `runs/` pattern in .gitignore once hid
    docs/results/runs/ (the trainer's scratch runs/ at the root stays ignored)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    probe = ["docs/results/runs/fp8_vs_nvfp4/nvfp4/seed1/metrics.jsonl", "runs/repro/fp8_vs_nvfp4/nvfp4/seed1/x"]
    out = subprocess.run(["git", "check-ignore", "--no-index", *probe], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == [probe[1]]


def test_committed_report_is_what_the_committed_runs_generate(tmp_path):
    """docs/results/reproduction.md regenerates from docs/results/runs (tables, verdicts, scale), and an arm
    with one seed is measured against the baseline's run of that seed (same data order), not its mean."""
    from nvfp4train.reproduce import report

    runs_root = REPO / "docs" / "results" / "runs"
    if not (runs_root / "nvfp4_ablations" / "no_sr").is_dir():
        pytest.skip("no committed ablation runs")
    out = tmp_path / "results"
    path = report.write_report(runs_root, out, REPO / "configs" / "reproduce", figures=False)
    committed = (REPO / "docs" / "results" / "reproduction.md").read_text()

    def tables(text):  # the lines that carry numbers (links and the runs path differ with figures off)
        return [line for line in text.splitlines() if line.startswith(("|", "- "))]
    assert tables(path.read_text()) == tables(committed)

    runs = {arm: report.arm_runs(runs_root, exp, arm) for exp, arm in
            [("nvfp4_ablations", "no_sr"), ("fp8_vs_nvfp4", "nvfp4")]}
    (arm_loss,) = report.end_values(runs["no_sr"], "heldout")
    (base_loss,) = report.end_values([r for r in runs["nvfp4"] if report.seed_of(r) == 1], "heldout")
    row = next(line for line in committed.splitlines()
               if line.startswith("| no_sr vs nvfp4 | held-out loss"))
    assert f"{(arm_loss - base_loss) / base_loss * 100:+.2f}%" in row and "against the baseline's seed 1" in row

    # the verdict on the main comparison pairs the seeds: each seed's nvfp4 held-out loss against the FP8 run
    # of the same seed (same data order and initialisation)
    fp8 = {report.seed_of(r): r for r in report.arm_runs(runs_root, "fp8_vs_nvfp4", "fp8_blockwise")}
    expected = [f"{(report.final_heldout(r) - report.final_heldout(fp8[report.seed_of(r)])) / report.final_heldout(fp8[report.seed_of(r)]) * 100:+.2f}% (seed {report.seed_of(r)})"
                for r in sorted(runs["nvfp4"], key=report.seed_of)]
    verdict = next(line for line in committed.splitlines() if line.startswith("- fp8_vs_nvfp4: nvfp4 vs fp8_blockwise"))
    assert len(expected) == 3 and "paired by seed " + ", ".join(expected) in verdict

    # a one-seed arm says something only beyond twice the baseline's seed spread
    single = [line for line in committed.splitlines() if line.startswith("- ") and " on one seed, " in line]
    assert single
    for line in single:
        gap, noise = (float(v) for v in re.search(r": ([-+\d.]+)% on one seed, .*?\(([\d.]+)%\)", line).groups())
        assert ("not resolved" in line) == (abs(gap) <= 2 * noise), line


def test_kernel_cache_travels_to_a_fresh_machine_and_refuses_a_hostile_archive(tmp_path, monkeypatch):
    """pack-kernels packs the Triton and Inductor caches where runs filled them; unpack-kernels (and
    launch) add them to empty caches on another machine, keeping entries already there; an archive that
    would write outside them is refused in one line; over the size limit Inductor's cache stays behind,
    then everything but the autotuning results."""
    import io
    import os

    from nvfp4train.train.kernel_cache import pack_kernel_cache

    def cli(root, *args):
        env = cli_env(TRITON_CACHE_DIR=root / "triton", TORCHINDUCTOR_CACHE_DIR=root / "inductor")
        return subprocess.run([sys.executable, "-m", "nvfp4train.reproduce", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)

    filled, fresh, out = tmp_path / "filled", tmp_path / "fresh", tmp_path / "out"
    entry = filled / "triton" / "4XJ2Q"
    entry.mkdir(parents=True)
    cubin = os.urandom(3 << 20)  # incompressible: 3 MiB of compiled kernel
    (entry / "_chunk_scan_fwd_kernel.cubin").write_bytes(cubin)
    (entry / "_chunk_scan_fwd_kernel.autotune.json").write_text('{"key": [64, 128], "best": {"BLOCK_SIZE_M": 64}}')
    (filled / "inductor" / "fxgraph" / "ab").mkdir(parents=True)
    graph = os.urandom(2 << 20)
    (filled / "inductor" / "fxgraph" / "ab" / "graph").write_bytes(graph)
    packed = cli(filled, "pack-kernels", "--out", str(out))
    assert packed.returncode == 0, packed.stderr
    assert "3 file(s), Triton's and Inductor's caches" in packed.stdout and (out / "kernels.tar.gz").is_file()

    (fresh / "triton" / "4XJ2Q").mkdir(parents=True)
    (fresh / "triton" / "4XJ2Q" / "_chunk_scan_fwd_kernel.autotune.json").write_text("this machine's own choice")
    unpacked = cli(fresh, "unpack-kernels", str(out / "kernels.tar.gz"))
    assert unpacked.returncode == 0 and f"2 file(s) from {out / 'kernels.tar.gz'} added to" in unpacked.stdout
    assert (fresh / "triton" / "4XJ2Q" / "_chunk_scan_fwd_kernel.cubin").read_bytes() == cubin
    assert (fresh / "triton" / "4XJ2Q" / "_chunk_scan_fwd_kernel.autotune.json").read_text() == "this machine's own choice"
    assert (fresh / "inductor" / "fxgraph" / "ab" / "graph").read_bytes() == graph

    for name in ("../escaped.json", "elsewhere/escaped.json"):
        hostile = tmp_path / "hostile.tar.gz"
        with tarfile.open(hostile, "w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
        refused = cli(fresh, "unpack-kernels", str(hostile))
        assert refused.returncode == 2 and f"unexpected member {name!r}" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("**/escaped.json"))
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not an archive")
    assert "not a readable kernel cache archive" in cli(fresh, "unpack-kernels", str(garbage)).stderr
    assert "no Triton kernels are cached" in cli(tmp_path / "empty", "pack-kernels", "--out", str(out)).stderr

    monkeypatch.setenv("TRITON_CACHE_DIR", str(filled / "triton"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(filled / "inductor"))
    assert pack_kernel_cache(tmp_path / "mid.tar.gz", limit=(4 << 20)) == (2, "Triton's cache (Inductor's left out)")
    n, what = pack_kernel_cache(tmp_path / "small.tar.gz", limit=1 << 20)  # the cubin does not fit 1 MiB
    assert (n, what) == (1, "Triton's autotuning results only")
    with tarfile.open(tmp_path / "small.tar.gz") as tar:
        assert tar.getnames() == ["triton/4XJ2Q/_chunk_scan_fwd_kernel.autotune.json"]
