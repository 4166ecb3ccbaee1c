"""The distributed engines on two GPUs (marked gpu; skipped with fewer than 2 CUDA GPUs, the Transformer Engine
cases also without an importable transformer_engine, the DeepSpeed case without deepspeed):

    python -m pytest -q -rsP -m gpu tests/gpu/test_distributed_gpu.py      # -rP: the measured differences

1. DeepSpeed ZeRO-1 and ZeRO-2 against DDP (tests/train/test_distributed_zero.py's check, on GPUs and NCCL):
   the same initial weights and global batches over 50 steps, loss curves within a stated tolerance.
2. Transformer Engine layers (precision.backend=te) under FSDP2, for each FP8 recipe TE runs on Hopper
   (fp8_tensorwise -> Float8CurrentScaling, fp8_blockwise -> Float8BlockScaling; TE's NVFP4 needs sm_100+):
   a run killed with SIGKILL after a checkpoint and resumed with train.resume=auto repeats the
   uninterrupted run's losses, bit for bit where two uninterrupted runs are bitwise equal.
3. FSDP2 on two GPUs against one GPU, BF16 and emulated NVFP4, compiled as a user runs them: the same global
   batches give the same loss curve within a stated tolerance (hybrid_1b's bench rows had NVFP4 under FSDP2
   3% below its one-GPU loss at step 16, where BF16's agreed within 0.2%).
4. DDP's step captured as a CUDA graph (train.cuda_graph=true) against eager DDP, uncompiled and compiled.

Every run is the trainer's own command under `python -m nvfp4train.launch --standalone --nproc_per_node=2`;
runs that are compared start side by side on the same two GPUs (each launcher has its own rendezvous port).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nvfp4train.launch.processes import kill_tree, run_and_kill_on_timeout
from nvfp4train.precision import hardware
from tests.conftest import REPO, cli_env, read_metrics

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not TWO_GPUS, reason="needs 2 CUDA GPUs")]
RUN_TIMEOUT = 600  # seconds before a run counts as hung (the runs here are small)


@pytest.fixture
def jobs():
    """The jobs a test launches; those still running when it ends (after a failed assertion) are killed with
    their ranks, so that no orphaned rank holds a GPU for the next test."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            kill_tree(proc)
        proc.log.close()


def launch(jobs: list, out: Path, *overrides: str) -> subprocess.Popen:
    """The trainer on 2 local ranks (added to `jobs`); stdout and stderr go to `out`.log beside the run
    directory. Each rank runs in a session of its own (torchrun's way): kill_tree ends the job whole."""
    cmd = [
        sys.executable,
        "-m",
        "nvfp4train.launch",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "nvfp4train.train",
        f"out_dir={out}",
        *overrides,
    ]
    log = open(out.with_name(out.name + ".log"), "a")  # noqa: SIM115 (closed by finish())
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    jobs.append(proc)
    return proc


def finish(proc: subprocess.Popen, out: Path, expect_ok: bool = True) -> str:
    """Wait for `proc` (killing it with its ranks past RUN_TIMEOUT); its output, asserted successful when
    expect_ok."""
    try:
        proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
    proc.log.flush()
    text = out.with_name(out.name + ".log").read_text()
    if expect_ok:
        assert proc.returncode == 0, f"{out.name}: exit code {proc.returncode}\n{text[-5000:]}"
    return text


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out) if "loss" in r}


def rel_diffs(a: dict[int, float], b: dict[int, float], steps) -> list[float]:
    return [abs(a[s] - b[s]) / abs(a[s]) for s in steps]


# ------------------------------------------------------------------------------ DeepSpeed ZeRO vs DDP
ZERO_STEPS = 50
ZERO_COMMON = [
    f"train.max_steps={ZERO_STEPS}",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",  # 2 micro-batches a step on each rank: DeepSpeed's and DDP's accumulation
    "train.seq_len=256",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=0",
    "train.save_every=0",
    "train.compile=false",
    "train.cuda_graph=false",
]
# DeepSpeed computes from BF16 weights (its FP32 masters live in the optimizer) and reduces BF16 gradients;
# the PyTorch engine computes from FP32 masters under BF16 autocast and reduces FP32 gradients. The GEMMs see
# the same BF16 operands either way (autocast rounds the FP32 weight as DeepSpeed stored it), so the engines
# part only in the non-GEMM arithmetic and in the gradient reductions, and training then amplifies that
# rounding like any other. Measured on two CPU ranks (tests/train/test_distributed_zero.py, the same model,
# the same 8 x 2 accumulation): step 1 within 1.4e-6, 50 steps within 2.0e-3 (ZeRO-2), 2.5e-3 between
# ZeRO-1 and ZeRO-2. GPUs add their run-to-run kernel noise (docs/results/resume_gpu.md: two DDP runs of
# hybrid_125m part by 1e-4 relative over 10 steps). Step 1 is a forward pass from the same weights on the
# same batch: 1e-3. The curve: 1e-2, five times the CPU measurement; a wrong batch order, learning rate or
# reduction (a sum where a mean belongs, a rank's gradients missing) moves the loss by more than that
# within 50 steps.
ZERO_STEP1_REL, ZERO_CURVE_REL = 1e-3, 1e-2


def test_zero1_and_zero2_track_ddp_on_two_gpus(tmp_path, jobs):
    """DDP, ZeRO-1 and ZeRO-2 on the same two GPUs, side by side: the same model (hybrid_tiny, the trainer's
    default, as the CPU test), seed, initial weights and global batches (the loader shards by rank alike for
    every engine). Both engines run eager: the DeepSpeed engine always does, and compiling only the DDP run
    would add Inductor's fused-kernel rounding to the difference being measured."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install 'nvfp4train[deepspeed]')")
    arms = {
        "ddp": ["train.parallel=ddp"],
        "zero1": ["train.parallel=deepspeed", "train.zero_stage=1"],
        "zero2": ["train.parallel=deepspeed", "train.zero_stage=2"],
    }
    procs = {name: launch(jobs, tmp_path / name, *ZERO_COMMON, *extra) for name, extra in arms.items()}
    outputs = {name: finish(proc, tmp_path / name) for name, proc in procs.items()}
    curves = {name: losses(tmp_path / name) for name in arms}
    for name, curve in curves.items():
        assert sorted(curve) == list(range(1, ZERO_STEPS + 1)), (name, sorted(curve)[-3:])
        assert all(math.isfinite(v) for v in curve.values()), (name, curve)
        parallel = "ddp" if name == "ddp" else "deepspeed"
        assert f"| {parallel} x2 on cuda" in outputs[name], outputs[name][-2000:]
    ddp, steps = curves["ddp"], range(1, ZERO_STEPS + 1)
    for name in ("zero1", "zero2"):
        diffs = rel_diffs(ddp, curves[name], steps)
        print(
            f"{name} vs ddp: step 1 {diffs[0]:.2e}, max over {ZERO_STEPS} steps {max(diffs):.2e} "
            f"(at step {diffs.index(max(diffs)) + 1}); final loss {curves[name][ZERO_STEPS]:.4f}, "
            f"ddp {ddp[ZERO_STEPS]:.4f}"
        )
        assert diffs[0] <= ZERO_STEP1_REL, (name, curves[name][1], ddp[1])
        assert max(diffs) <= ZERO_CURVE_REL, (name, [(s, ddp[s], curves[name][s]) for s in steps][-10:])
        assert curves[name][ZERO_STEPS] < curves[name][1] - 0.5  # and it trains
    zero_gap = max(rel_diffs(curves["zero1"], curves["zero2"], steps))
    print(f"zero2 vs zero1: max over {ZERO_STEPS} steps {zero_gap:.2e}")


# ---------------------------------------------------------------- Transformer Engine layers under FSDP2
@functools.cache
def te_unavailable() -> str | None:
    """Why the TE cases cannot run here (None: they can): `transformer_engine.pytorch` must import in a fresh
    process, as each rank will import it (an installed but broken TE fails there, not at find_spec)."""
    if not hardware.te_installed():
        return "transformer_engine is not installed (docs/results/te.md: scripts/te_on_gpu.sh install)"
    proc = run_and_kill_on_timeout(
        [sys.executable, "-c", "import transformer_engine.pytorch"],
        cwd=REPO,
        env=cli_env(),
        timeout=300,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return f"transformer_engine.pytorch does not import: {last[:200]}"
    return None


TE_STEPS, TE_SAVE_EVERY = 24, 6
TE_COMMON = [
    "train.parallel=fsdp2",
    "precision.backend=te",
    f"train.max_steps={TE_STEPS}",
    f"train.save_every={TE_SAVE_EVERY}",
    "train.keep_last=8",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",  # 2 micro-batches a step on each rank: TE under FSDP2's no-sync accumulation
    "train.seq_len=128",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",  # the held-out pass of the sharded TE model at the end
    "train.compile=false",
    "train.deterministic=true",
    "train.resume=auto",
]
# Where two uninterrupted runs differ at all (TE's kernels are not covered by train.deterministic:
# docs/determinism.md), the resumed steps are held to 1%: the single-GPU TE resume test's bound
# (tests/precision/test_te.py), where a BF16 FSDP2 resume on GPUs stayed within 6.7e-4 over 10 steps
# (docs/results/resume_gpu.md) and FP8's coarser grid turns a last-bit difference in a weight into a
# whole FP8 step more often. A resume that restored the wrong weights, moments, data position or step
# (so the wrong learning rate) moves a loss by more than that.
TE_RESUME_REL = 1e-2


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_blockwise"])
def test_te_layers_under_fsdp2_resume_after_a_kill(tmp_path, jobs, recipe):
    """hybrid_tiny with every linear a TE layer (its in_proj's 648 outputs padded for TE), sharded per block by
    FSDP2 on two GPUs: run `ref` straight through; run `cut`, started beside it with the same command, is
    killed (SIGKILL to the launcher and both ranks) once its step-6 checkpoint is complete, and the same
    command again resumes it (train.resume=auto: the latest complete checkpoint, step 6 or later if the kill
    came late). Eager (train.compile=false): this checks resumption, and compiling would add a minute per run.
    train.deterministic=true makes the rest of the model (attention, the SSD, cuBLAS) repeat bit for bit, so
    the steps before the kill, two uninterrupted runs, tell whether this path is deterministic here: if they
    are bitwise equal, the resumed steps must be too; otherwise within TE_RESUME_REL."""
    why = te_unavailable()
    if why:
        pytest.skip(why)
    overrides = [f"precision={recipe}", *TE_COMMON]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    ref_proc, cut_proc = launch(jobs, ref, *overrides), launch(jobs, cut, *overrides)
    marker = cut / "checkpoints" / f"step_{TE_SAVE_EVERY:08d}" / "meta.json"  # written last, then renamed in
    deadline = time.monotonic() + RUN_TIMEOUT
    while not marker.exists():
        if cut_proc.poll() is not None or time.monotonic() > deadline:
            text = finish(cut_proc, cut, expect_ok=False)
            pytest.fail(f"{recipe}: the run ended or hung before its step-{TE_SAVE_EVERY} checkpoint:\n{text[-5000:]}")
        time.sleep(0.01)
    kill_tree(cut_proc)  # SIGKILL to the launcher and both ranks (each rank is in a session of its own)
    finish(cut_proc, cut, expect_ok=False)
    assert cut_proc.returncode == -signal.SIGKILL, cut_proc.returncode
    ref_out = finish(ref_proc, ref)
    assert "(te) | fsdp2 x2 on cuda" in ref_out and "deterministic" in ref_out, ref_out[-2000:]
    shards = sorted((ref / "checkpoints" / f"step_{TE_STEPS:08d}" / "model_optim").glob("*.distcp"))
    assert len(shards) == 2, shards  # one DCP shard per rank: the weights and moments were sharded

    resume_out = finish(launch(jobs, cut, *overrides), cut)
    found = re.search(r"resumed from \S*step_(\d+)", resume_out)
    assert found, resume_out[-2000:]
    resumed_at = int(found.group(1))
    assert TE_SAVE_EVERY <= resumed_at < TE_STEPS, f"the kill came after the run finished (resumed at {resumed_at})"

    a, b = losses(ref), losses(cut)
    assert sorted(a) == sorted(b) == list(range(1, TE_STEPS + 1)), (sorted(a)[-3:], sorted(b)[-3:])
    assert all(math.isfinite(v) for v in [*a.values(), *b.values()]), (a, b)
    before = range(1, resumed_at + 1)  # two uninterrupted runs: their difference is the GPUs' own
    after = range(resumed_at + 1, TE_STEPS + 1)
    deterministic = all(a[s] == b[s] for s in before)
    diffs = rel_diffs(a, b, after)
    print(
        f"{recipe}: resumed at step {resumed_at}; steps 1-{resumed_at} (no resume) "
        f"{'bitwise equal' if deterministic else f'differ by up to {max(rel_diffs(a, b, before)):.2e}'}; "
        f"steps {resumed_at + 1}-{TE_STEPS} (resumed): {sum(a[s] == b[s] for s in after)}/{len(after)} bitwise "
        f"equal, max rel diff {max(diffs):.2e}; final loss {a[TE_STEPS]:.4f}"
    )
    if deterministic:
        assert [b[s] for s in after] == [a[s] for s in after], [(s, a[s], b[s]) for s in after if a[s] != b[s]]
    else:
        assert max(diffs) <= TE_RESUME_REL, [(s, a[s], b[s]) for s in after]
    assert a[TE_STEPS] < a[1] - 0.5  # and it trains


# ------------------------------------------------------------- FSDP2 against one GPU, BF16 and NVFP4
ONE_VS_FSDP_STEPS = 24
ONE_VS_FSDP_COMMON = [
    "model=hybrid_125m",
    f"train.max_steps={ONE_VS_FSDP_STEPS}",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",  # one GPU: 2 micro-batches a step; FSDP2: one on each rank
    "train.seq_len=512",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=0",
    "train.save_every=0",
    "optim.schedule.warmup_steps=4",  # past the warmup early: a wrong update size shows within the run
]
# Two CPU processes against one (tests/train/test_distributed_fsdp.py's setup, hybrid_tiny, 16 steps at the
# peak learning rate from step 3): BF16 within 2e-4 relative at every step, NVFP4 within 3.2e-3 (its
# stochastic rounding draws other bits once the micro-batches sit on other ranks). GPUs add their kernel
# noise and Inductor's fusions; 1.5e-2 is five times the NVFP4 bound, below the 3.3% hybrid_1b showed.
ONE_VS_FSDP_REL = 1.5e-2


@pytest.mark.parametrize("precision", ["bf16", "nvfp4"])
def test_fsdp2_tracks_one_gpu(tmp_path, jobs, precision):
    """The trainer's defaults on CUDA (compiled and CUDA-graphed, FSDP2's step with its collectives): one GPU
    with and without the graph, side by side on GPUs 0 and 1, then FSDP2 on both. Same seed, initial weights
    and global batches in all three."""
    overrides = [f"precision={precision}", *ONE_VS_FSDP_COMMON]
    singles = {}
    for gpu, (name, extra) in enumerate({"one": [], "one_eager": ["train.cuda_graph=false"]}.items()):
        out = tmp_path / name
        log = open(out.with_name(name + ".log"), "a")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "nvfp4train.train", f"out_dir={out}", *overrides, *extra]
        proc = subprocess.Popen(
            cmd, cwd=REPO, env={**cli_env(), "CUDA_VISIBLE_DEVICES": str(gpu)}, stdout=log, stderr=subprocess.STDOUT
        )
        proc.log = log
        jobs.append(proc)
        singles[name] = proc
    for name, proc in singles.items():
        finish(proc, tmp_path / name)
    finish(launch(jobs, tmp_path / "fsdp2", *overrides, "train.parallel=fsdp2"), tmp_path / "fsdp2")
    curves = {name: losses(tmp_path / name) for name in ("one", "one_eager", "fsdp2")}
    steps = range(1, ONE_VS_FSDP_STEPS + 1)
    for name, curve in curves.items():
        assert sorted(curve) == list(steps), (name, sorted(curve)[-3:])
    one = curves["one"]
    for name in ("one_eager", "fsdp2"):
        diffs = rel_diffs(one, curves[name], steps)
        print(
            f"{precision} {name} vs one GPU (graphed): max rel diff {max(diffs):.2e} at step "
            f"{diffs.index(max(diffs)) + 1}; step {ONE_VS_FSDP_STEPS}: {curves[name][ONE_VS_FSDP_STEPS]:.4f} vs "
            f"{one[ONE_VS_FSDP_STEPS]:.4f}"
        )
    for name in ("one_eager", "fsdp2"):
        diffs = rel_diffs(one, curves[name], steps)
        assert max(diffs) <= ONE_VS_FSDP_REL, (name, [(s, one[s], curves[name][s]) for s in steps])
    assert one[ONE_VS_FSDP_STEPS] < one[1] - 0.5  # and it trains


# ------------------------------------------------------------- DDP's and FSDP2's step captured as a CUDA graph
DDP_GRAPH_STEPS = 20  # DDP: 11 eager warm-up steps (DDP_WARMUP_STEPS), then 9 replays; FSDP2: 2, then 17
DDP_GRAPH_COMMON = [
    "model=hybrid_tiny",
    "model.ssd_backend=torch",  # no mamba-ssm autotuning: the runs take about a minute
    "precision=nvfp4",  # SR streams registered with the graph, the quantized weights rebuilt inside it
    f"train.max_steps={DDP_GRAPH_STEPS}",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",  # 2 micro-batches a step on each rank: no_sync inside the capture
    "train.seq_len=256",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=0",
    "train.save_every=0",
    "train.parallel=ddp",
    "optim.schedule.warmup_steps=4",
]


# Measured on 2 H200s (commit 836f787), DDP: uncompiled, the graphed run's 20 losses equal the eager run's bit for
# bit; compiled, the two differ by at most 1.8e-3 from step 2 on, before any replay (the run-to-run spread of
# compiled GPU runs). A replay without the all-reduce, or with a rank's gradients counted twice, moves the loss by
# more. FSDP2 (gathers, reduce-scatters and the gathered weights' memory inside the graph) is held to the same.
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
@pytest.mark.parametrize("compile_, tolerance", [("false", 1e-4), ("true", ONE_VS_FSDP_REL)])
def test_cuda_graph_tracks_eager_steps(tmp_path, jobs, parallel, compile_, tolerance):
    """train.cuda_graph=true under DDP or FSDP2 (the collectives inside the graph) against eager steps, side by
    side on the same two GPUs: the same seed, initial weights and global batches give the same loss curve, and
    the graphed run captured its step and exits (a graph left holding NCCL's collectives hangs the process
    group's end)."""
    common = [*_with_parallel(DDP_GRAPH_COMMON, parallel), f"train.compile={compile_}"]
    procs = {
        "graph": launch(jobs, tmp_path / "graph", *common, "train.cuda_graph=true"),
        "eager": launch(jobs, tmp_path / "eager", *common, "train.cuda_graph=false"),
    }
    for name, proc in procs.items():
        finish(proc, tmp_path / name)
    log = (tmp_path / "graph" / "train.log").read_text()
    assert "cuda graph: captured the step (2 micro-batches" in log, log[-3000:]
    graph, eager = losses(tmp_path / "graph"), losses(tmp_path / "eager")
    steps = range(1, DDP_GRAPH_STEPS + 1)
    assert sorted(graph) == sorted(eager) == list(steps)
    diffs = rel_diffs(eager, graph, steps)
    print(
        f"{parallel}, compile={compile_}: graphed vs eager: max rel diff {max(diffs):.2e} at step "
        f"{diffs.index(max(diffs)) + 1}; step {DDP_GRAPH_STEPS}: {graph[DDP_GRAPH_STEPS]:.4f} vs "
        f"{eager[DDP_GRAPH_STEPS]:.4f}"
    )
    assert max(diffs) <= tolerance, [(s, eager[s], graph[s]) for s in steps]
    assert graph[DDP_GRAPH_STEPS] < graph[1] - 0.5


DDP_GRAPH_LONG_STEPS, DDP_GRAPH_SAVE_AT = 32, 16


def _with_parallel(overrides: list[str], parallel: str) -> list[str]:
    return [f"train.parallel={parallel}" if o == "train.parallel=ddp" else o for o in overrides]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_cuda_graph_through_telemetry_eval_switch_and_resume(tmp_path, jobs, parallel):
    """What makes a DDP or FSDP2 graph release and recapture, against eager steps (uncompiled, so the curves
    are equal up to the GPUs' own noise): a telemetry step (precision.stats_every=14: steps 14 and 28 run
    eagerly, the graph captured again after them), held-out evaluations between replays (every 10 steps; under
    FSDP2 they leave gathered weights behind, which the next eager step or capture must not use), the switch to
    BF16 at 60% of the tokens (new recipes: more eager steps, then a new capture), and a run killed after its
    step-16 checkpoint and resumed (a new process: eager steps, then captures of its own). Every run exits,
    i.e. each graph holding NCCL's collectives was freed."""
    overrides = [
        *_with_parallel(DDP_GRAPH_COMMON, parallel),
        f"train.max_steps={DDP_GRAPH_LONG_STEPS}",
        "train.compile=false",
        "precision.stats_every=14",
        "precision.switch.at_fraction=0.6",
        "train.eval_every=10",
        "train.eval_sequences=4",
        f"train.save_every={DDP_GRAPH_SAVE_AT}",
        "train.resume=auto",
    ]
    eager, graph, cut = tmp_path / "eager", tmp_path / "graph", tmp_path / "cut"
    procs = {
        eager: launch(jobs, eager, *overrides, "train.cuda_graph=false"),
        graph: launch(jobs, graph, *overrides, "train.cuda_graph=true"),
        cut: launch(jobs, cut, *overrides, "train.cuda_graph=true"),
    }
    marker = cut / "checkpoints" / f"step_{DDP_GRAPH_SAVE_AT:08d}" / "meta.json"  # written last
    deadline = time.monotonic() + RUN_TIMEOUT
    while not marker.exists():
        if procs[cut].poll() is not None or time.monotonic() > deadline:
            text = finish(procs[cut], cut, expect_ok=False)
            pytest.fail(f"the run ended or hung before its step-{DDP_GRAPH_SAVE_AT} checkpoint:\n{text[-5000:]}")
        time.sleep(0.01)
    kill_tree(procs[cut])
    finish(procs[cut], cut, expect_ok=False)
    for out in (eager, graph):
        finish(procs[out], out)
    resume_out = finish(launch(jobs, cut, *overrides, "train.cuda_graph=true"), cut)
    found = re.search(r"resumed from \S*step_(\d+)", resume_out)
    assert found and DDP_GRAPH_SAVE_AT <= int(found.group(1)) < DDP_GRAPH_LONG_STEPS, resume_out[-2000:]

    log = (graph / "train.log").read_text()
    captures = [int(n) for n in re.findall(r"cuda graph: captured the step .*capture #(\d+)", log)]
    assert len(captures) >= 3, log[-3000:]  # the first capture, again after telemetry, again after the switch
    steps = range(1, DDP_GRAPH_LONG_STEPS + 1)
    curves = {name: losses(out) for name, out in (("eager", eager), ("graph", graph), ("cut", cut))}
    for name, curve in curves.items():
        assert sorted(curve) == list(steps), (name, sorted(curve)[-3:])
    for name in ("graph", "cut"):
        diffs = rel_diffs(curves["eager"], curves[name], steps)
        print(f"{parallel}: {name} vs eager: max rel diff {max(diffs):.2e} at step {diffs.index(max(diffs)) + 1}")
        assert max(diffs) <= 1e-4, [(s, curves["eager"][s], curves[name][s]) for s in steps]
    evals = [r for r in read_metrics(graph) if "val/mean" in r]
    assert len(evals) >= 3 and all(math.isfinite(r["val/mean"]) for r in evals), evals


def test_hsdp_replicas_track_ddp(tmp_path, jobs):
    """train.parallel=hsdp with train.hsdp_shard_size=1 on two GPUs (two replicas of one shard: the replicate
    all-reduce over NCCL, which one node's default layout, one shard group, never runs) against DDP, side by
    side, uncompiled: the same global batches give the same loss curve within the FSDP2-vs-one-GPU tolerance
    (FSDP2 computes from BF16 copies of the weights, DDP under autocast from the FP32 ones)."""
    common = [*DDP_GRAPH_COMMON, "train.compile=false"]
    ddp, hsdp = tmp_path / "ddp", tmp_path / "hsdp"
    procs = {
        ddp: launch(jobs, ddp, *common),
        hsdp: launch(
            jobs,
            hsdp,
            *[o for o in common if o != "train.parallel=ddp"],
            "train.parallel=hsdp",
            "train.hsdp_shard_size=1",
        ),
    }
    for out, proc in procs.items():
        finish(proc, out)
    assert "HSDP: 2 replica(s) of FSDP2 over 1 rank(s) each" in (hsdp / "train.log").read_text()
    # train.cuda_graph=auto captures both steps: NVFP4's under DDP, HSDP's (FSDP2) in any precision
    assert "cuda graph: captured the step" in (ddp / "train.log").read_text()
    assert "cuda graph: captured the step" in (hsdp / "train.log").read_text()
    a, b = losses(ddp), losses(hsdp)
    steps = range(1, DDP_GRAPH_STEPS + 1)
    assert sorted(a) == sorted(b) == list(steps)
    diffs = rel_diffs(a, b, steps)
    print(f"hsdp 2x1 vs ddp: max rel diff {max(diffs):.2e} at step {diffs.index(max(diffs)) + 1}")
    assert max(diffs) <= ONE_VS_FSDP_REL, [(s, a[s], b[s]) for s in steps]
