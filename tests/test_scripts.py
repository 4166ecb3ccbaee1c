"""The user scripts under scripts/ read their command line: a wrong verb gives the usage line and exit 2, a
right one runs (scripts/te_on_gpu.sh once shifted its arguments twice and stopped every verb at the usage)."""

import shutil
import subprocess

import pytest

from tests.conftest import REPO, cli_env

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _te(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/te_on_gpu.sh", *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("args", [(), ("bogus",)])
def test_te_script_without_a_verb_prints_its_usage(args):
    proc = _te(*args)
    assert (
        proc.returncode == 2
        and "usage: bash scripts/te_on_gpu.sh download | install | check" in proc.stderr + proc.stdout
    )


def test_te_script_runs_the_verb_it_is_given():
    """`check` here (no Transformer Engine installed) gets as far as importing it: the verb ran."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("Transformer Engine is installed: check would run the GPU tests")
    proc = _te("check")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "usage:" not in out and "transformer_engine" in out, out[-2000:]
