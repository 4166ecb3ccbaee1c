"""Every command line in README.md's fenced bash blocks runs as written (with few steps).

Each line (and each part of an `a && b` chain) is classified: installs and the test suite itself are
skipped here, because CI (.ci/run) runs README's first two lines as written, each in a fresh virtual
environment: the plain install and the main job (which must train to its last step with a falling loss),
then the test install and this suite; test_ci_runs_the_first_two_lines_as_written checks that it does;
`python -m nvfp4train.*` and `torchrun` (2 CPU ranks) run in a scratch directory with
`train.max_steps=2` (eval: 4 items a task, 2 held-out sequences a source); `sbatch` lines run as
`DRY_RUN=1 bash slurm/...` on an 8-GPU node of the requested node count, and the rendered job's config must
validate at that world size. The runs that the compare / eval / export examples read (runs/exp/*) are trained
first, tiny, in the same scratch directory.
"""

import re
import shlex
import sys

import pytest

from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env

STEPS = "train.max_steps=2"
EVAL_FEW = {"max_items=": 4, "heldout_sequences=": 2}
GPUS_PER_NODE = 8  # what the sbatch scripts ask for (#SBATCH --gpus-per-node=8)


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.extend(part.strip() for part in line.split("&&"))
    return lines


def classify(cmd: str) -> tuple[str, str]:
    words = shlex.split(cmd)
    env = [w for w in words if re.fullmatch(r"[A-Z_]+=\S*", w)]
    prog = words[len(env) :]
    if (
        prog[:2] == ["python3", "-m"]
        and prog[2] == "venv"
        or prog[0] in (".", "source", "pip")
        or "pip" in prog[:1]
        or "install" in prog[:2]
    ):
        return "skip", "installs packages (README's first two lines: .ci/run runs them as written in CI)"
    if prog[:3] == ["python", "-m", "pytest"]:
        return "skip", "the whole test suite (.ci/run runs it in CI)"
    if prog[0] == "sbatch":
        return "sbatch", ""
    if prog[0] == "torchrun" or prog[:2] == ["python", "-m"] and prog[2].startswith("nvfp4train"):
        return "run", ""
    if prog[0] == "bash" and prog[1].startswith("slurm/"):
        return "run", ""
    raise AssertionError(f"README command not classified (add it to this test): {cmd}")


COMMANDS = readme_commands()


def test_readme_starts_with_install_and_the_test_suite():
    text = (REPO / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert first[0].endswith("&& python -m nvfp4train.train") and "python -m pytest" in first[1]
    assert any(classify(c)[0] != "skip" for c in COMMANDS)


def test_ci_runs_the_first_two_lines_as_written():
    """.ci/run takes README's first two lines verbatim (it runs the first, the main job, in its own fresh
    environment and checks its loss falls, then the second): the lines it would run are README's."""
    text = (REPO / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    proc = run_and_kill_on_timeout(["bash", str(REPO / ".ci" / "run"), "--print"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == first[:2]
    script = (REPO / ".ci" / "run").read_text()
    assert 'bash -c "$main_cmd"' in script and 'bash -c "$test_cmd"' in script
    assert "metrics.jsonl" in script and "rm -rf .venv" in script


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A working directory like a fresh clone's: slurm/ reachable, the compare/eval example runs trained."""
    root = tmp_path_factory.mktemp("readme")
    (root / "slurm").symlink_to(REPO / "slurm")
    for arm in ("bf16", "nvfp4"):
        _run(
            [
                sys.executable,
                "-m",
                "nvfp4train.train",
                f"precision={arm}",
                f"out_dir=runs/exp/{arm}",
                "train.max_steps=4",
                "train.log_every=1",
                "train.eval_sequences=2",
            ],
            root,
        )
    return root


def _run(argv, cwd, env=None):
    proc = run_and_kill_on_timeout(argv, cwd=cwd, env=cli_env(**(env or {})), timeout=600)
    assert proc.returncode == 0, (
        f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )
    return proc


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_runs(cmd, scratch):
    kind, reason = classify(cmd)
    if kind == "skip":
        pytest.skip(reason)
    words = shlex.split(cmd)
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=\S*", w))
    prog = words[len(env) :]
    if kind == "sbatch":  # the job script as sbatch would start it on GPU nodes, rendered only
        nodes = next((int(w.split("=")[1]) for w in prog if w.startswith("--nodes=")), 1)
        script = next(w for w in prog if w.startswith("slurm/"))
        overrides = prog[prog.index(script) + 1 :]
        env.update(DRY_RUN="1", SLURM_NNODES=str(nodes), SLURM_GPUS_ON_NODE=str(GPUS_PER_NODE))
        _check_rendered_job(_run(["bash", script, *overrides], scratch, env).stdout)
        return
    if "nvfp4train.train" in prog:  # train: few steps, and no second value for the same key
        prog = [w for w in prog if not w.startswith("train.max_steps=")] + [STEPS, "train.eval_sequences=2"]
    if "nvfp4train.eval" in prog:  # eval: every task, few items (the full default takes minutes on 2 CPU cores)
        prog = [w for w in prog if not w.startswith(tuple(EVAL_FEW))] + [f"{k}{v}" for k, v in EVAL_FEW.items()]
    if prog[0] == "python":
        prog[0] = sys.executable
    proc = _run(prog, scratch, env)
    assert "Traceback" not in proc.stderr and "Setting OMP_NUM_THREADS" not in proc.stderr, proc.stderr[-2000:]


def _check_rendered_job(rendered: str) -> None:
    """The rendered torchrun line's config composes and fits its world size (micro-batch, global batch)."""
    from nvfp4train.config import RunConfig, compose, resolve_micro_batch

    line = next(row for row in rendered.splitlines() if "-m nvfp4train.train" in row)
    words = shlex.split(line)
    nnodes = next((int(w.split("=")[1]) for w in words if w.startswith("--nnodes=")), 1)
    nproc = next(int(w.split("=")[1]) for w in words if w.startswith("--nproc_per_node="))
    overrides = words[words.index("nvfp4train.train") + 1 :]
    cfg = RunConfig.from_omegaconf(compose("train", overrides))
    resolve_micro_batch(cfg.train, nnodes * nproc)
