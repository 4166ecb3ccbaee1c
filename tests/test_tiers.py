"""Every test module is in exactly one tier (unit, integration, e2e or gpu: tests/conftest.py), CUDA-only modules
are under tests/gpu/, a unit test can neither start a process nor compile with Inductor, no unit test is marked
slow, and README's test command (which CI runs) selects no tier.

The module checks cover the modules this session collected: all of them in the whole suite."""

import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import GPU_DIR, REPO, TIERS

pytestmark = pytest.mark.unit  # declared: this file names the process-starting calls it guards against


def _modules(session) -> dict[Path, list]:
    by_path: dict[Path, list] = {}
    for item in session.items:
        by_path.setdefault(Path(item.path).resolve(), []).append(item)
    return by_path


def test_every_module_has_exactly_one_tier(request):
    for path, items in _modules(request.session).items():
        tiers = {name for item in items for name in ("unit", "integration", "e2e") if item.get_closest_marker(name)}
        if GPU_DIR in path.parents:
            assert not tiers and all(item.get_closest_marker("gpu") for item in items), path
        else:
            assert len(tiers) == 1, f"{path.relative_to(REPO)}: tiers {sorted(tiers)}"


def test_cuda_only_modules_are_under_tests_gpu(request):
    for path, items in _modules(request.session).items():
        if GPU_DIR not in path.parents:
            assert not all(item.get_closest_marker("gpu") for item in items), (
                f"{path.relative_to(REPO)}: every test needs CUDA; move it under tests/gpu/ (git mv)"
            )


def test_gpu_modules_skip_without_cuda():
    for path in sorted(GPU_DIR.glob("test_*.py")):
        text = path.read_text()
        assert "skipif(not" in text or "pytest.skip(" in text, f"{path.relative_to(REPO)} does not skip without CUDA"


def test_the_tiers_of_known_modules(request):
    """The classifier on modules whose tier is plain: the CLI through tests.conftest.run_train, through a
    conftest's shared trained run (tiny_run) or a subprocess of its own is e2e; quantizer maths in-process is
    unit; the model under torch.compile and a training run per precision preset are integration."""
    expected = {
        "tests/e2e/test_default_run.py": "e2e",
        "tests/eval/test_hf_export.py": "e2e",
        "tests/test_lint.py": "e2e",
        "tests/formats/test_nvfp4.py": "unit",
        "tests/test_tiers.py": "unit",
        "tests/model/test_compile.py": "integration",
        "tests/precision/test_training.py": "integration",
    }
    collected = _modules(request.session)
    for rel, tier in expected.items():
        items = collected.get((REPO / rel).resolve())
        if items is None:
            continue  # not collected in this session (a run of one file)
        assert items[0].get_closest_marker(tier), f"{rel} should be {tier}"


def test_a_unit_test_that_starts_a_python_child_fails_with_what_to_do():
    import subprocess

    with pytest.raises(AssertionError, match=r"is in the unit tier but starts .*pytestmark = pytest.mark.e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_unit_test_that_compiles_with_inductor_fails_with_what_to_do():
    import torch

    with pytest.raises(AssertionError, match=r"is in the unit tier but compiles with Inductor: .*mark.integration"):
        torch.compile(torch.neg)
    traced = torch.compile(lambda x: -x, backend="eager")  # dynamo's tracing alone generates no code: allowed
    assert traced(torch.ones(2)).tolist() == [-1.0, -1.0]


def test_no_unit_test_is_marked_slow(request):
    """`slow` (more than ~20 s on 2 cores) and the quick loop exclude each other: such a test's module is
    integration (or e2e)."""
    slow = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker("unit") and item.get_closest_marker("slow")
    ]
    assert slow == [], "marked slow in the unit tier (move them to an integration module): " + ", ".join(slow)


def test_the_readme_and_ci_command_selects_every_cpu_tier():
    """README's test line (CI runs it through .ci/run) and pytest's configured options deselect no tier."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {line.split(":")[0] for line in config["markers"]}
    assert set(TIERS) <= declared
    assert "-m" not in str(config.get("addopts", "")).split()
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S).group(1)
    test_line = block.splitlines()[1]
    assert test_line.endswith("python -m pytest -q"), test_line
    ci_options = re.search(r'^export PYTEST_ADDOPTS="(.*)"$', (REPO / ".ci" / "run").read_text(), flags=re.M).group(1)
    assert "-m" not in ci_options.split(), ci_options
