"""Keep only one GPU architecture's machine code in a shared library's CUDA fat binaries.

    python scripts/te_prune_fatbin.py libtransformer_engine.so --keep-arch 90 [--list]

Transformer Engine's wheel ships `libtransformer_engine.so` (343 MB) whose `.nv_fatbin` section
(263 MB) holds, for each of its 89 compilation units, one compressed cubin per architecture
(sm_75, 80, 89, 90, 100, 103, 107, 120; no PTX). A Hopper GPU loads only the sm_90 cubins (18 MB).
`nvprune` would drop the others but is not on PyPI; this does the same inside the file, in place:
each fat binary container is rewritten to hold only the kept entries (moved to its front, its size
field shrunk) and the freed bytes are zeroed. Offsets and sizes of every ELF section stay as they
were, so the library needs no relinking; the zeros cost nothing once compressed. On any other
architecture the pruned library fails with CUDA's "no kernel image is available" error.

Fat binary layout (as CUDA 12/13 write it; read by cuobjdump, reimplemented by e.g. ZLUDA):
    container header: u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of the entries
    entry header:     u16 kind (1 PTX, 2 cubin), u16 version, u32 header size, u64 payload size,
                      ..., u32 arch at byte 28 (e.g. 90), ...; the payload follows its header.
A container whose entries hold no kept architecture is left whole (its code cannot run there anyway).
"""

from __future__ import annotations

import argparse
import collections
import mmap
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50


def fatbin_section(m) -> tuple[int, int]:
    """(file offset, size) of the ELF64 little-endian section `.nv_fatbin`."""
    if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
        raise SystemExit("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", m, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", m, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", m, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = sections[shstrndx][4]
    for name_off, _type, _flags, _addr, offset, size in sections:
        end = m.find(b"\0", strtab_off + name_off)
        if m[strtab_off + name_off : end] == b".nv_fatbin":
            return offset, size
    raise SystemExit("no .nv_fatbin section: this library holds no CUDA device code")


def containers(m, offset: int, size: int):
    """Yield (start, header size, entries size) of each fat binary container in the section."""
    p, end = offset, offset + size
    while p < end:
        magic, _version, header_size, entries_size = struct.unpack_from("<IHHQ", m, p)
        if magic != FATBIN_MAGIC:  # alignment padding between containers
            p += 8
            continue
        yield p, header_size, entries_size
        p += header_size + entries_size


def entries(m, start: int, header_size: int, entries_size: int):
    """Yield (offset, total size, kind, arch) of each entry of one container."""
    q, end = start + header_size, start + header_size + entries_size
    while q < end:
        kind, _version, entry_header_size, payload_size = struct.unpack_from("<HHIQ", m, q)
        (arch,) = struct.unpack_from("<I", m, q + 28)
        yield q, entry_header_size + payload_size, kind, arch
        q += entry_header_size + payload_size
    if q != end:
        raise SystemExit(f"fat binary at {start:#x}: entries overrun the container ({q:#x} != {end:#x})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("library")
    ap.add_argument("--keep-arch", type=int, default=90, help="SM architecture to keep (default 90)")
    ap.add_argument("--list", action="store_true", help="only print bytes per (kind, arch); change nothing")
    args = ap.parse_args()

    with open(args.library, "rb" if args.list else "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ if args.list else mmap.ACCESS_WRITE)
        offset, size = fatbin_section(m)
        before, after = collections.Counter(), collections.Counter()
        n_containers = n_whole = 0
        for start, header_size, entries_size in containers(m, offset, size):
            n_containers += 1
            found = list(entries(m, start, header_size, entries_size))
            for _q, total, kind, arch in found:
                before[("ptx" if kind == 1 else "cubin", arch)] += total
            kept = [(q, total) for q, total, kind, arch in found if arch == args.keep_arch]
            if not kept:
                n_whole += 1
                kept = [(q, total) for q, total, _k, _a in found]
            for q, total, kind, arch in found:
                if (q, total) in kept:
                    after[("ptx" if kind == 1 else "cubin", arch)] += total
            if args.list:
                continue
            blob = b"".join(bytes(m[q : q + total]) for q, total in kept)
            body = start + header_size
            m[body : body + entries_size] = blob + bytes(entries_size - len(blob))
            struct.pack_into("<Q", m, start + 8, len(blob))
        if not args.list:
            m.flush()
        m.close()
    print(
        f"{args.library}: .nv_fatbin {size} bytes, {n_containers} fat binaries"
        + (f" ({n_whole} without sm_{args.keep_arch}, left whole)" if n_whole else "")
    )
    for key in sorted(before):
        print(
            f"  {key[0]:5s} sm_{key[1]:<4d} {before[key]:>11d} bytes -> {after.get(key, 0):>11d}"
            + ("" if args.list else " kept" if after.get(key) else " zeroed")
        )
    if args.list:
        return
    print(f"kept {sum(after.values())} of {sum(before.values())} bytes of device code")


if __name__ == "__main__":
    sys.exit(main())
