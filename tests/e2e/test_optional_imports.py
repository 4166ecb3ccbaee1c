"""The package imports, and its entry points answer --help, without any optional package.

A plain `pip install -e .` (README's first line) brings none of the optional packages, and the CPU torch
wheel brings no triton. Each check runs in a subprocess whose sys.meta_path starts with a finder that
raises ImportError for the optional packages, as if they were not installed, so a top-level import of
one of them anywhere on an entry point's import path fails here.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap

import pytest

import nvfp4train
from tests.conftest import REPO, cli_env

OPTIONAL = (
    "triton",
    "matplotlib",
    "datasets",
    "wandb",
    "deepspeed",
    "transformer_engine",
    "mamba_ssm",
    "causal_conv1d",
    "lm_eval",
    "tiktoken",
    "torchao",
    "transformers",
    "einops",
    "pyarrow",
)
# Modules that are themselves code for an optional package, imported only where it is used; each must
# name what to pip install when the package is missing.
KERNEL_MODULES = ("", "common", "amax", "rounding", "e2m1", "nvfp4", "mxfp4", "rht", "fp8", "dequant", "sm90")
OPTIONAL_MODULES = {
    **{f"nvfp4train.formats.kernels{name and '.' + name}": "triton" for name in KERNEL_MODULES},
    "nvfp4train.model.causal_conv": "triton",
    "nvfp4train.model.partial_sums": "triton",
    "nvfp4train.model.residual_norm": "triton",
    "nvfp4train.optim.adamw_kernel": "triton",
    "nvfp4train.eval.lm_eval_adapter": "pip install",
}
ENTRY_POINTS = [
    "nvfp4train.train",
    "nvfp4train.eval",
    "nvfp4train.export",
    "nvfp4train.summary",
    "nvfp4train.compare",
    "nvfp4train.reproduce",
    "nvfp4train.data.prepare",
    "nvfp4train.generate",
]

BLOCKER = textwrap.dedent(f"""
    import sys
    BLOCKED = {OPTIONAL!r}
    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"No module named {{name!r}} (blocked: optional package)", name=name)
            return None
    sys.meta_path.insert(0, Blocked())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]
""")


def run_blocked(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run `code` (after the blocker) in a fresh interpreter, as `python -c`, with argv = args."""
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code), *args],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def all_modules() -> list[str]:
    names = ["nvfp4train"]
    for info in pkgutil.walk_packages(nvfp4train.__path__, "nvfp4train."):
        if not info.name.endswith(".__main__"):  # run as `python -m`: test_entry_point_help runs those
            names.append(info.name)
    return sorted(names)


def test_blocker_blocks():
    proc = run_blocked("import triton")
    assert proc.returncode != 0 and "blocked: optional package" in proc.stderr


def test_every_module_imports_without_optional_packages():
    modules = all_modules()
    assert set(ENTRY_POINTS) <= set(modules) | {"nvfp4train.train", "nvfp4train.eval"}
    assert set(OPTIONAL_MODULES) <= set(modules)
    proc = run_blocked(
        """
        import importlib, json, sys, traceback
        failures = {}
        for name in sys.argv[1:]:
            try:
                importlib.import_module(name)
            except BaseException as e:
                failures[name] = f"{type(e).__name__}: {e}"
        print(json.dumps(failures))
    """,
        *modules,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    unexpected = {k: v for k, v in failures.items() if k not in OPTIONAL_MODULES}
    assert not unexpected, f"modules that import an optional package at top level: {unexpected}"
    for name, error in failures.items():
        assert OPTIONAL_MODULES[name] in error, f"{name} fails without naming the package: {error}"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_entry_point_help_without_optional_packages(entry):
    proc = run_blocked(
        """
        import runpy, sys
        sys.argv = [sys.argv[1], "--help"]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    """,
        entry,
    )
    assert proc.returncode == 0, (
        f"{entry} --help failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )
    assert "Traceback" not in proc.stderr
    out = proc.stdout.lower()
    assert "usage" in out and len(proc.stdout.splitlines()) < 80, proc.stdout
