"""mypy passes on the packages that [tool.mypy] in pyproject.toml names (formats/, precision/, config/)."""

import pytest

from tests.conftest import REPO


def test_mypy_passes_on_the_typed_packages(monkeypatch):
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (pip install -e '.[test]' brings it)")
    monkeypatch.chdir(REPO)  # [tool.mypy] and its file list are read from the repository's pyproject.toml
    stdout, stderr, status = api.run(["--config-file", str(REPO / "pyproject.toml"), "--no-error-summary"])
    assert status == 0, stdout[-6000:] + stderr[-2000:]
