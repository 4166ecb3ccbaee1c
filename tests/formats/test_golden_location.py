"""Where the golden vectors are looked for: $NVFP4TRAIN_SHARED first, then <repo>/../shared."""

from __future__ import annotations

from . import conftest


def test_env_var_comes_first_and_repo_sibling_second(monkeypatch, tmp_path):
    monkeypatch.setenv("NVFP4TRAIN_SHARED", str(tmp_path))
    candidates = conftest.shared_dir_candidates()
    assert candidates[0] == tmp_path and candidates[1] == conftest.REPO.parent / "shared"
    # An env var pointing at a folder without the vectors falls through to the next candidate.
    found = conftest.golden_dir()
    assert found is None or found.parent.parent != tmp_path
    (tmp_path / conftest.GOLDEN_SUBDIR).mkdir(parents=True)
    (tmp_path / conftest.GOLDEN_SUBDIR / "manifest.json").write_text("{}")
    assert conftest.golden_dir() == tmp_path / conftest.GOLDEN_SUBDIR
