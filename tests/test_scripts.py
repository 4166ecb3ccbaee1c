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


@pytest.mark.parametrize(
    "script", ["single_node.sbatch", "multi_node.sbatch", "ab_array.sbatch", "reproduce_array.sbatch"]
)
def test_every_sbatch_script_appends_to_its_log(script):
    """A requeued job (preemption) writes the same --output file again: without append mode it truncates the
    log of the run so far."""
    text = (REPO / "slurm" / script).read_text()
    assert "#SBATCH --output=" in text and "\n#SBATCH --open-mode=append\n" in text


def test_multi_node_srun_passes_the_cpus_per_task():
    """srun does not inherit sbatch's --cpus-per-task (Slurm 22.05 on): the step would get one CPU per task."""
    proc = subprocess.run(
        ["bash", "slurm/multi_node.sbatch", "out_dir=runs/x"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env=cli_env(DRY_RUN=1, SLURM_NNODES=2, SLURM_CPUS_PER_TASK=64, SLURM_JOB_NODELIST="node01"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "srun --kill-on-bad-exit=1 --cpus-per-task=64 " in proc.stdout, proc.stdout
