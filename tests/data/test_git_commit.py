"""`git_commit`: the code's revision as recorded in runs and benchmark rows."""

import subprocess

from nvfp4train.data import paths


def _repo(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True)

    git("init", "-q")
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "train.json").write_text("[]\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    return tmp_path


def test_results_written_by_a_benchmark_leave_the_commit_clean_and_code_changes_do_not(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setattr(paths, "REPO_ROOT", repo)
    monkeypatch.setattr(paths, "SHIPPED_ROOT", repo / "no_shipped_tree")
    clean = paths.git_commit(short=True)
    assert clean and not clean.endswith("-dirty") and clean != "unknown"
    (repo / "docs" / "results" / "train.json").write_text('[{"row": 1}]\n')  # what bench_train merges
    assert paths.git_commit(short=True) == clean
    (repo / "model.py").write_text("x = 2\n")
    assert paths.git_commit(short=True) == clean + "-dirty"
