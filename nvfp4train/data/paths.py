"""Where relative paths in configs point, and which commit of the repository is checked out (recorded
beside results and benchmarks).

Relative paths in configs (`data/bundled/...`, `data/tokenizer/bpe8k.json`, the token cache `data/cache`)
are written relative to the repository root, not the working directory, so a run reads the same files
from wherever it is started. An installed wheel has no repository: it ships a copy of the files the
default run reads as nvfp4train/_shipped/ (setup.py), laid out as in the repository, and writes its token
cache under a per-user cache directory, laid out the same way (never into site-packages)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_ROOT = Path(__file__).resolve().parents[1] / "_shipped"  # a wheel's copy; a source checkout has none


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/nvfp4train, else ~/.cache/nvfp4train: where an installed package writes its token
    cache (site-packages may be read-only, and is shared by every user of the environment)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "nvfp4train"


def resolve_path(path, *, cache: bool = False) -> Path:
    """An absolute path as it is. A relative one, in a source checkout (or an editable install): under
    the repository root, or under the working directory when only it has that path (a user's own data
    files, named from where they are: docs/data.md). In an installed wheel: a file the wheel ships (the
    bundled corpus and tokenizer) where it is; a cache directory (`cache=True`: data.cache_dir, so `data/cache` ->
    ~/.cache/nvfp4train/data/cache) under user_cache_dir(); any other path under the working directory,
    the only root a user of an installed package can name.
    A path that exists in none of these places is returned anyway: the caller's error names it."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    if not SHIPPED_ROOT.is_dir():
        if not cache and not (REPO_ROOT / p).exists() and (Path.cwd() / p).exists():
            return Path.cwd() / p
        return REPO_ROOT / p
    if cache:
        return user_cache_dir() / p
    return SHIPPED_ROOT / p if (SHIPPED_ROOT / p).exists() else Path.cwd() / p


def searched_paths(path) -> list[Path]:
    """Where resolve_path(path) looks for a relative path that exists nowhere, in its order: what a
    "not found" line names (the working directory too, not only the repository)."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return [p]
    roots = [REPO_ROOT, Path.cwd()] if not SHIPPED_ROOT.is_dir() else [SHIPPED_ROOT, Path.cwd()]
    return list(dict.fromkeys(root / p for root in roots))


def git_commit(short: bool = False) -> str:
    """HEAD of the repository (`-dirty` appended when tracked files other than `docs/results/` differ from
    it), or "unknown" where there is no git or no .git (a copy of the tree, an installed wheel). Results are
    left out because the benchmarks merge their rows there: a second row of one invocation is the same code."""
    if SHIPPED_ROOT.is_dir():  # an installed wheel: a .git above site-packages (a venv in a checkout) is not ours
        return "unknown"

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", *(["--short"] if short else []), "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/results")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("-dirty" if head and dirty else "")
