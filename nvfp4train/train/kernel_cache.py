"""Triton's kernel cache: one directory that runs share, and a file that carries it to a fresh GPU machine.

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


def pack_kernel_cache(out: Path, limit: int) -> tuple[int, str]:
    """Write the Triton cache to `out` (gzip tar): everything when it fits `limit` bytes, else the
    autotuning results alone (the chosen configurations then compile in seconds, without the timing of
    every candidate). Returns (files packed, what)."""
    root = Path(persistent_kernel_caches())
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("tmp"))
    autotune = [p for p in files if p.name.endswith(AUTOTUNE_SUFFIX)]
    if not files:
        raise KernelCacheError(f"{root}: no Triton kernels are cached there yet (train or benchmark on the GPU first)")
    for what, chosen in (("every cached kernel", files), ("the autotuning results only", autotune)):
        if not chosen:
            continue
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
            for path in chosen:
                tar.add(path, arcname=path.relative_to(root).as_posix())
        if buffer.tell() <= limit:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(buffer.getvalue())
            return len(chosen), what
    raise KernelCacheError(f"{root}: {len(files)} cached files, {len(autotune)} autotuning results: even those come "
                           f"to more than {limit / 2**20:.0f} MiB packed")


def unpack_kernel_cache(archive: Path) -> tuple[int, str]:
    """Add the archive's entries to the Triton cache, keeping any entry already there. Returns (files
    added, the cache directory). Refuses an archive with anything but plain files under relative paths."""
    root = Path(persistent_kernel_caches())
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for m in members:
                parts = Path(m.name).parts
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in parts:
                    raise KernelCacheError(f"{archive}: unexpected member {m.name!r} (a Triton cache holds plain "
                                           "files under relative paths)")
            new = [m for m in members if m.isfile() and not (root / m.name).exists()]
            root.mkdir(parents=True, exist_ok=True)
            tar.extractall(root, members=new, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise KernelCacheError(f"{archive}: not a readable kernel cache archive ({e})") from None
    return len(new), str(root)
