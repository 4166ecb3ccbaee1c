"""Time the nvfp4train.formats quantizers on one device and print a table (ms, GB/s).

    python scripts/bench_quant.py                 # CPU: 4096x4096; CUDA (if present): 4096^2 and 8192^2
    python scripts/bench_quant.py --device cpu --sizes 2048 --dtype float32

GB/s counts the bytes read (the input) plus the bytes written (packed codes and scales for
``quantize``, the dense output for ``fake_quantize``), divided by the median time. These are the
eager PyTorch reference paths; fast kernels are a separate issue.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from nvfp4train.formats import fp8, hadamard, mxfp4, nvfp4, sr_generator  # noqa: E402


def nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (tuple, list)):
        return sum(nbytes(u) for u in t)
    if hasattr(t, "nbytes"):
        return t.nbytes
    raise TypeError(type(t))


def cases(device):
    gen = lambda: sr_generator(0, 0, device)  # noqa: E731
    return [
        ("nvfp4.quantize 1x16 rne", lambda x: nvfp4.quantize(x, (1, 16), "rne")),
        ("nvfp4.quantize 1x16 sr", lambda x: nvfp4.quantize(x, (1, 16), "sr", gen())),
        ("nvfp4.quantize 16x16 rne", lambda x: nvfp4.quantize(x, (16, 16), "rne")),
        ("nvfp4.fake_quantize 1x16 rne", lambda x: nvfp4.fake_quantize(x, (1, 16), "rne")),
        ("nvfp4.fake_quantize 1x16 sr", lambda x: nvfp4.fake_quantize(x, (1, 16), "sr", gen())),
        ("nvfp4.fake_quantize 16x16 rne", lambda x: nvfp4.fake_quantize(x, (16, 16), "rne")),
        ("hadamard.rht d=16", lambda x: hadamard.rht(x, 16)),
        ("mxfp4.quantize rne", lambda x: mxfp4.quantize(x, "rne")),
        ("mxfp4.quantize sr", lambda x: mxfp4.quantize(x, "sr", generator=gen())),
        ("mxfp4.fake_quantize rne", lambda x: mxfp4.fake_quantize(x, "rne")),
        ("fp8.quantize_tensorwise e4m3", lambda x: fp8.quantize_tensorwise(x, torch.float8_e4m3fn)),
        ("fp8.quantize_blockwise 1x128 e4m3", lambda x: fp8.quantize_blockwise(x, (1, 128))),
        ("fp8.quantize_blockwise 128x128 e4m3", lambda x: fp8.quantize_blockwise(x, (128, 128))),
        ("fp8.fake_quantize_blockwise 1x128", lambda x: fp8.fake_quantize_blockwise(x, (1, 128), out_dtype=x.dtype)),
    ]


def time_ms(fn, x, repeats: int) -> tuple[float, object]:
    out = fn(x)  # warm-up (and the output whose size we count)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn(x)
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=int, nargs="+", help="square sizes (default 4096, plus 8192 on CUDA)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 5 CPU, 20 CUDA)")
    args = parser.parse_args()

    device = torch.device(args.device)
    sizes = args.sizes or ([4096, 8192] if device.type == "cuda" else [4096])
    repeats = args.repeats or (20 if device.type == "cuda" else 5)
    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"# {name}, torch {torch.__version__}, input {args.dtype}, median of {repeats}")
    print(f"{'case':40s} {'shape':>11s} {'ms':>9s} {'GB/s':>8s}")
    for n in sizes:
        x = torch.randn(n, n, device=device, dtype=dtype)
        for label, fn in cases(device):
            ms, out = time_ms(fn, x, repeats)
            gbps = (nbytes(x) + nbytes(out)) / (ms * 1e-3) / 1e9
            print(f"{label:40s} {f'{n}x{n}':>11s} {ms:9.2f} {gbps:8.2f}", flush=True)
        del x


if __name__ == "__main__":
    main()
