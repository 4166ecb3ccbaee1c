"""Where the repository is: relative paths in data configs are relative to its root, not the working
directory; and which commit of it is checked out (recorded beside results and benchmarks)."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_path(path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def git_commit(short: bool = False) -> str:
    """HEAD of the repository (`-dirty` appended when tracked files differ from it), or "unknown" where
    there is no git or no .git (a copy of the tree, an installed wheel)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()

    try:
        head = git("rev-parse", *(["--short"] if short else []), "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("-dirty" if head and dirty else "")
