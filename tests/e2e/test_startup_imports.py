"""`--help` answers without the heavy modules: torch, torch.compile's machinery, DCP, the
kernels' packages and the optional ones. Each check runs the entry point in a fresh interpreter and lists
what it imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, cli_env

HEAVY = (
    "torch",
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "numpy",
    "sympy",
    "triton",
    "mamba_ssm",
    "causal_conv1d",
    "transformers",
    "datasets",
    "wandb",
    "matplotlib",
    "scipy",
)


def imported_by(code: str, *argv: str) -> set[str]:
    """The HEAVY modules in sys.modules after `code` ran (SystemExit from --help included)."""
    script = textwrap.dedent(f"""
        import sys
        sys.argv = {list(argv)!r}
        try:
            {code}
        except SystemExit as e:
            assert e.code in (0, None), e.code
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in proc.stdout.lower() or not argv
    return set(eval(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("entry", ["nvfp4train.train", "nvfp4train.reproduce"])
def test_help_imports_nothing_heavy(entry):
    code = f"import runpy; runpy.run_module({entry!r}, run_name='__main__', alter_sys=True)"
    assert imported_by(code, entry, "--help") == set()


def test_every_commands_config_loads_without_torch():
    """The run config (model, precision, data, optim sections) and the other commands' options: what --help and
    the override checks read before a run starts."""
    code = (
        "from nvfp4train.config import RunConfig, COMMANDS, compose, group_options; "
        "RunConfig.from_omegaconf(compose('train', ['model=hybrid_5m', 'precision=nvfp4']))"
    )
    assert imported_by(code) == set()
