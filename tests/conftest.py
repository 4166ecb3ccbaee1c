"""Shared helpers: run the real CLI in a subprocess, read its metrics."""

from __future__ import annotations

import inspect
import io
import json
import os
import subprocess
import sys
import textwrap
import tokenize
from functools import cache
from pathlib import Path

import pytest

from nvfp4train.launch.processes import kill_tree, run_and_kill_on_timeout

REPO = Path(__file__).resolve().parents[1]

# A small model with all three block types, groups > 1, GQA and a sequence that spans several
# SSD chunks: big enough to exercise every code path, small enough for 2 CPU cores.
SMALL_MODEL = {
    "name": "test_small",
    "pattern": "M*-M",
    "vocab_size": 97,
    "d_model": 32,
    "ffn_hidden": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 8,
    "mamba_groups": 2,
    "mamba_state": 8,
    "mamba_head_dim": 8,
    "mamba_chunk": 8,
    "ssd_backend": "torch",
}
# Offline everywhere: no hub retries, no W&B network.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


# Test tiers: every test module is exactly one of these (tests/test_tiers.py checks it), so `-m unit` is the
# quick in-process loop, `-m integration` the in-process tests that compile or train (declared by their
# module), `-m e2e` the CLI / subprocess / torchrun runs, `-m gpu` the CUDA checks.
TIERS = ("unit", "integration", "e2e", "gpu")
IN_PROCESS_TIERS = ("unit", "integration")
GPU_DIR = REPO / "tests" / "gpu"
# A module (or a fixture or tests/ helper it uses) naming one of these starts a process: it is e2e.
STARTS_A_PROCESS = frozenset(
    {
        "subprocess",
        "Popen",
        "executable",  # sys.executable: a Python child
        "run_train",
        "run_torchrun",
        "train_cmd",
        "cli_env",
        "spawn",
        "run_and_kill_on_timeout",
        "run_check_in_triton_interpreter",
    }
)


@cache
def _names_in(obj) -> frozenset[str]:
    """The identifiers in ``obj``'s source (a module or function), strings and comments left out."""
    try:
        source = textwrap.dedent(inspect.getsource(obj))
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return frozenset(t.string for t in tokens if t.type == tokenize.NAME)
    except (OSError, TypeError, tokenize.TokenError, IndentationError, SyntaxError):
        return frozenset()


def _test_helper(obj) -> bool:
    """A function or fixture written under tests/ (not pytest's own, not this file's process guard)."""
    if not inspect.isfunction(obj) or obj.__name__ == "_in_process_tests_start_no_process":
        return False
    try:
        return (REPO / "tests") in Path(inspect.getsourcefile(obj) or "").resolve().parents
    except TypeError:
        return False


def _starts_a_process(module, items) -> bool:
    """Whether ``module``'s tests start a process: its own code, the tests/ helpers it imports and the
    fixtures its tests use (a conftest's shared trained run) are read for the names above."""
    helpers = [v for v in vars(module).values() if _test_helper(v) and v.__module__ != module.__name__]
    for item in items:
        for defs in item._fixtureinfo.name2fixturedefs.values():
            helpers.extend(d.func for d in defs if _test_helper(d.func))
    return any(STARTS_A_PROCESS & _names_in(obj) for obj in [module, *helpers])


def module_tier(module, items) -> str:
    """gpu under tests/gpu/, else the tier a module declares (``pytestmark = pytest.mark.integration``), else e2e
    when it starts a process and unit when it does not."""
    path = Path(module.__file__).resolve()
    if GPU_DIR in path.parents:
        return "gpu"
    marks = getattr(module, "pytestmark", [])
    declared = {m.name for m in (marks if isinstance(marks, list) else [marks])} & {"unit", "integration", "e2e"}
    if len(declared) == 1:
        return declared.pop()
    return "e2e" if _starts_a_process(module, items) else "unit"


def pytest_collection_modifyitems(config, items):
    by_module: dict = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None:
            by_module.setdefault(module, []).append(item)
    start_rank = {}
    for module, module_items in by_module.items():
        tier = module_tier(module, module_items)
        for item in module_items:
            item.add_marker(getattr(pytest.mark, tier))
            item.stash[TIER_KEY] = tier
        slow = any(item.get_closest_marker("slow") for item in module_items)
        start_rank[module] = 0 if slow else {"e2e": 1, "integration": 2}.get(tier, 3)
    # The longest modules first: under --dist loadscope (.ci/run) each module runs whole on one worker, handed
    # out in this order, so a module of minute-long runs started last would keep one worker busy while the
    # others idle; the quick unit modules fill the end. Within a module the order stays as written.
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (start_rank.get(getattr(item, "module", None), 3), position[id(item)]))


TIER_KEY = pytest.StashKey[str]()
PROJECT_COMMANDS = ("nvfp4train", "torchrun", "torch.distributed.run", "pytest", "ruff", "benchmarks", "slurm/", ".ci/")


def _started_by_a_compiler(torch_dir: str) -> bool:
    """Whether the Popen being made is torch's or triton's own (inductor's compile workers and probes, a C
    compiler), not the test's: the first caller outside subprocess.py is in their packages (torch.distributed's
    launcher excepted)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == subprocess.__file__:
        frame = frame.f_back
    caller = frame.f_code.co_filename if frame is not None else ""
    compilers = (torch_dir, str(Path(torch_dir).parent / "triton"))
    return caller.startswith(compilers) and not caller.startswith(str(Path(torch_dir) / "distributed"))


@pytest.fixture(autouse=True)
def _in_process_tests_start_no_process(request, monkeypatch):
    """A unit or integration test that starts the CLI, torchrun, a Python child or a shell fails at once with
    what to do, so `-m unit` and `-m integration` stay in-process as tests are added (what torch.compile and
    triton start to compile are not the test's own processes and are let through)."""
    tier = request.node.stash.get(TIER_KEY, None)
    if tier not in IN_PROCESS_TIERS:
        return
    original = subprocess.Popen.__init__
    torch_dir = str(Path(__import__("torch").__file__).parent)

    def guarded(self, args, *a, **kw):
        argv = [str(args)] if isinstance(args, (str, bytes, os.PathLike)) else [str(w) for w in args]
        program = Path(argv[0].split()[0]).name if argv and argv[0] else ""
        python = program.startswith("python") or argv[0] == sys.executable
        project = python or program in ("bash", "sh", "torchrun") or any(c in " ".join(argv) for c in PROJECT_COMMANDS)
        if project and not _started_by_a_compiler(torch_dir):
            raise AssertionError(
                f"{request.node.nodeid} is in the {tier} tier but starts `{' '.join(argv)[:200]}`: add "
                "`pytestmark = pytest.mark.e2e` to its module (docs/testing.md, test tiers)"
            )
        original(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


@pytest.fixture(autouse=True)
def _unit_tests_do_not_compile(request, monkeypatch):
    """A CPU unit test that calls torch.compile with Inductor (its default backend, which generates and
    compiles C++ for a CPU graph: tens of seconds for a small model on 2 cores) fails at once with what to do,
    so `-m unit` stays a loop of minutes. Dynamo's tracing backends ("eager", "aot_eager") stay allowed; a
    CUDA test (``gpu``) runs only on a GPU machine and may compile."""
    if request.node.stash.get(TIER_KEY, None) != "unit" or request.node.get_closest_marker("gpu"):
        return
    import torch

    original = torch.compile

    def guarded(*args, backend="inductor", **kwargs):
        if backend == "inductor":
            raise AssertionError(
                f"{request.node.nodeid} is in the unit tier but compiles with Inductor: add "
                '`pytestmark = pytest.mark.integration` to its module or compile with backend="aot_eager" '
                "(docs/testing.md, test tiers)"
            )
        return original(*args, backend=backend, **kwargs)

    monkeypatch.setattr(torch, "compile", guarded)


def cli_env(**extra) -> dict:
    # the repository first, then whatever the caller's PYTHONPATH holds (dependencies installed there)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_check_in_triton_interpreter(module: str) -> None:
    """Run ``module``'s ``check('cpu')`` in a subprocess with TRITON_INTERPRET=1 (triton reads it at import,
    so it must not leak into this process) and assert that it passed."""
    pytest.importorskip("triton")
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", f"from {module} import check; check('cpu')"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO)),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]


@pytest.fixture
def spawn():
    """subprocess.Popen for a test that signals or watches a job while it runs; at the test's end, pass or
    fail, whatever of it still runs is ended whole (kill_tree), so a failed test leaves no training behind
    to slow the tests after it."""
    started: list[subprocess.Popen] = []

    def start(cmd, **popen_kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(cmd, **popen_kwargs))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            kill_tree(proc)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "nvfp4train.train", *overrides]


def run_train(*overrides: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = run_and_kill_on_timeout(train_cmd(*overrides), cwd=REPO, env=cli_env(), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_torchrun(
    *overrides: str,
    launcher: str = "nvfp4train.launch",
    nproc: int = 2,
    env: dict | None = None,
    timeout: float = 600,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """The trainer on ``nproc`` local ranks (gloo on CPU) under ``launcher`` (nvfp4train.launch or stock
    torch.distributed.run) with --standalone: a free rendezvous port, so runs side by side never collide."""
    cmd = [
        sys.executable,
        "-m",
        launcher,
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "nvfp4train.train",
        *overrides,
    ]
    proc = run_and_kill_on_timeout(cmd, cwd=REPO, env=env or cli_env(OMP_NUM_THREADS=1), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def read_metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def quick():
    """Overrides for a fast CPU run of the default model and data."""
    return ["train.max_steps=12", "train.log_every=1", "train.eval_sequences=2", "train.progress=false"]


def poison_checkpoint(ckpt: Path, tensor: str) -> None:
    """Write a NaN into one tensor of `ckpt`'s DCP weights and moments (`model.<name>` or `optim.<fqn>.<key>`),
    as a damaged or tampered file would hold it; meta.json and the rank files stay as written."""
    import shutil
    import tempfile
    import warnings

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    dcp_dir = Path(ckpt) / "model_optim"
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = Path(scratch) / "whole.pt"
        dcp_to_torch_save(dcp_dir, whole)
        state = torch.load(whole, weights_only=True)
        section, name = tensor.split(".", 1)
        node = state[section]
        if section == "optim":
            fqn, key = name.rsplit(".", 1)
            node, name = node[fqn], key
        node[name].view(-1)[0] = float("nan")
        torch.save(state, whole)
        shutil.rmtree(dcp_dir)
        torch_save_to_dcp(whole, dcp_dir)
