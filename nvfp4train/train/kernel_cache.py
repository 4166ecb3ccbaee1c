"""Triton's (and Inductor's) kernel caches: directories that runs share, and a file that carries them to a
fresh GPU machine.

mamba-ssm's SSD kernels autotune on their first call: every candidate configuration is compiled and timed,
about 100 s on an idle H100 and 180 s when 11 runs start together on one H200 (their time to first step in
docs/results/runs/, commit 55f312a); the same runs started again on that machine, with the cache warm,
took 49 s (7 runs). A lent GPU machine starts bare, so the cache is packed where it was filled
(`python -m nvfp4train.reproduce pack-kernels --out $OUT`), carried back as `.carry/kernels.tar.gz`, and
unpacked before the next runs start (`launch` does it; `unpack-kernels` for anything else). Triton keys
each entry by the kernel's source, its arguments' specialisation, the Triton version and the GPU target, so
an entry from another machine of the same architecture and software is used and any other is ignored.
"""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

KERNEL_ARCHIVE = Path(".carry/kernels.tar.gz")
AUTOTUNE_SUFFIX = ".autotune.json"  # Triton's cached autotuning choice for one kernel and key


def persistent_kernel_caches() -> str:
    """Triton's compiled kernels and autotuning results (mamba-ssm's SSD and layer-norm kernels, Inductor's
    kernels) in one directory shared by runs, so only the first run on a machine pays the ~100 s of
    autotuning. TRITON_CACHE_DIR when set (point it at shared storage to share it across nodes), else
    ~/.cache/nvfp4train/triton; Inductor's cache lives beside it unless TORCHINDUCTOR_CACHE_DIR is set.
    Set before the first kernel compiles (Triton reads them then)."""
    root = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".cache" / "nvfp4train" / "triton")
    os.environ.setdefault("TRITON_CACHE_DIR", str(root))
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # Triton >= 3.2 keeps autotuning choices there
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root.parent / "inductor"))
    return str(root)


class KernelCacheError(ValueError):
    """A kernel cache archive that cannot be packed or unpacked (one line for the user)."""


def cache_dirs() -> dict[str, Path]:
    """The directories an archive's top-level folders map to: `triton/` (TRITON_CACHE_DIR: mamba-ssm's and
    our kernels, autotuning choices) and `inductor/` (TORCHINDUCTOR_CACHE_DIR: torch.compile's graphs and
    kernels, for compiled runs)."""
    persistent_kernel_caches()
    return {"triton": Path(os.environ["TRITON_CACHE_DIR"]), "inductor": Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])}


def _cached_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("tmp")) if root.is_dir() else []


def pack_kernel_cache(out: Path, limit: int) -> tuple[int, str]:
    """Write the caches to `out` (gzip tar, `triton/...` and `inductor/...`): both when they fit `limit`
    bytes, else Triton's alone, else its autotuning results alone (the chosen configurations then compile
    in seconds, without timing every candidate). Returns (files packed, what)."""
    dirs = cache_dirs()
    triton_files, inductor_files = _cached_files(dirs["triton"]), _cached_files(dirs["inductor"])
    autotune = [p for p in triton_files if p.name.endswith(AUTOTUNE_SUFFIX)]
    if not triton_files:
        raise KernelCacheError(f"{dirs['triton']}: no Triton kernels are cached there yet (train or benchmark on the "
                               "GPU first)")
    tiers = [("Triton's and Inductor's caches", [("triton", triton_files), ("inductor", inductor_files)]),
             ("Triton's cache (Inductor's left out)", [("triton", triton_files)]),
             ("Triton's autotuning results only", [("triton", autotune)])]
    for what, parts in tiers:
        if what.startswith("Triton's and") and not inductor_files:
            continue
        chosen = [(name, path) for name, paths in parts for path in paths]
        if not chosen:
            continue
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
            for name, path in chosen:
                tar.add(path, arcname=f"{name}/{path.relative_to(dirs[name]).as_posix()}")
        if buffer.tell() <= limit:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(buffer.getvalue())
            return len(chosen), what
    raise KernelCacheError(f"{dirs['triton']}: {len(triton_files)} cached files, {len(autotune)} autotuning results: "
                           f"even those come to more than {limit / 2**20:.0f} MiB packed")


def unpack_kernel_cache(archive: Path) -> tuple[int, str]:
    """Add the archive's entries to the caches (`triton/...` to TRITON_CACHE_DIR, `inductor/...` to
    TORCHINDUCTOR_CACHE_DIR), keeping any entry already there. Returns (files added, the directories).
    Refuses an archive with anything but plain files under those two folders."""
    dirs = cache_dirs()
    try:
        with tarfile.open(archive) as tar:
            new: dict[str, list[tarfile.TarInfo]] = {name: [] for name in dirs}
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if (not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in parts or not parts
                        or parts[0] not in dirs or (m.isfile() and len(parts) < 2)):
                    raise KernelCacheError(f"{archive}: unexpected member {m.name!r} (a kernel cache archive holds "
                                           "plain files under triton/ and inductor/)")
                if m.isfile():
                    m.name = Path(*parts[1:]).as_posix()
                    if not (dirs[parts[0]] / m.name).exists():
                        new[parts[0]].append(m)
            for name, members in new.items():
                if members:
                    dirs[name].mkdir(parents=True, exist_ok=True)
                    tar.extractall(dirs[name], members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise KernelCacheError(f"{archive}: not a readable kernel cache archive ({e})") from None
    return sum(map(len, new.values())), ", ".join(str(d) for d in dirs.values())
