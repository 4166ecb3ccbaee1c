"""Time the nvfp4train.formats quantizers and print a table (ms, GB/s), eager vs compiled.

    python scripts/bench_quant.py                                  # CPU, and CUDA if present
    python scripts/bench_quant.py --device cpu --shapes 4096x512 --dtype float32
    python scripts/bench_quant.py --device cuda --shapes 4096x4096 8192x8192

"eager" runs the plain PyTorch ops (the default). "compiled" is the opt-in
NVFP4TRAIN_COMPILE_QUANT=1 path: on CUDA the torch.compile twins of quantize / fake_quantize (formats/compiled.py;
the first call, which compiles, is the warm-up and is not timed). On CPU there are no twins, so
the column is empty unless --compile-cpu (compiles each case with torch.compile, slow to start).
GB/s counts the bytes read (the input) plus the bytes written (packed codes and scales for
``quantize``, the dense output for ``fake_quantize``), divided by the median time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from nvfp4train.formats import compiled, fp8, hadamard, mxfp4, nvfp4, sr_generator  # noqa: E402

# Cases whose public function dispatches to a compiled twin on CUDA.
TWINNED = ("nvfp4.quantize", "nvfp4.fake_quantize", "mxfp4.quantize", "mxfp4.fake_quantize")


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
    bf16 = torch.bfloat16
    return [
        ("nvfp4.quantize 1x16 rne", lambda x: nvfp4.quantize(x, (1, 16), "rne")),
        ("nvfp4.quantize 1x16 sr", lambda x: nvfp4.quantize(x, (1, 16), "sr", gen())),
        ("nvfp4.quantize 16x16 rne", lambda x: nvfp4.quantize(x, (16, 16), "rne")),
        ("nvfp4.fake_quantize 1x16 rne", lambda x: nvfp4.fake_quantize(x, (1, 16), "rne", out_dtype=bf16)),
        ("nvfp4.fake_quantize 1x16 sr", lambda x: nvfp4.fake_quantize(x, (1, 16), "sr", gen(), out_dtype=bf16)),
        ("nvfp4.fake_quantize 16x16 rne", lambda x: nvfp4.fake_quantize(x, (16, 16), "rne", out_dtype=bf16)),
        ("nvfp4.fake_quantize 16x16 sr", lambda x: nvfp4.fake_quantize(x, (16, 16), "sr", gen(), out_dtype=bf16)),
        ("NVFP4Tensor.dequantize bf16", None),  # built per input below (needs a quantized tensor)
        ("hadamard.rht d=16", lambda x: hadamard.rht(x, 16)),
        ("mxfp4.quantize rne", lambda x: mxfp4.quantize(x, "rne")),
        ("mxfp4.quantize sr", lambda x: mxfp4.quantize(x, "sr", generator=gen())),
        ("mxfp4.fake_quantize rne", lambda x: mxfp4.fake_quantize(x, "rne", out_dtype=bf16)),
        ("mxfp4.fake_quantize sr", lambda x: mxfp4.fake_quantize(x, "sr", generator=gen(), out_dtype=bf16)),
        ("fp8.quantize_tensorwise e4m3", lambda x: fp8.quantize_tensorwise(x, torch.float8_e4m3fn)),
        ("fp8.quantize_blockwise 1x128 e4m3", lambda x: fp8.quantize_blockwise(x, (1, 128))),
        ("fp8.quantize_blockwise 128x128 e4m3", lambda x: fp8.quantize_blockwise(x, (128, 128))),
        ("fp8.fake_quantize_blockwise 1x128", lambda x: fp8.fake_quantize_blockwise(x, (1, 128), out_dtype=x.dtype)),
    ]


def time_ms(fn, x, repeats: int) -> tuple[float, object]:
    out = fn(x)  # warm-up (compiles where it applies) and the output whose size we count
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn(x)
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), out


def set_compiled(on: bool) -> None:
    os.environ[compiled.ENV_VAR] = "1" if on else "0"


def bench_device(device: torch.device, shapes, dtype, repeats: int, compile_cpu: bool) -> None:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        name = f"CPU ({torch.get_num_threads()} threads, load average {load:.2f})"
    print(f"\n# {name}, torch {torch.__version__}, input {dtype}, median of {repeats}")
    print(f"{'case':38s} {'shape':>11s} {'eager ms':>9s} {'GB/s':>7s} {'compiled ms':>12s} {'GB/s':>7s} {'speedup':>8s}")
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device=device, dtype=dtype)
        q = nvfp4.quantize(x)
        for label, fn in cases(device):
            if fn is None:
                fn = lambda _x, q=q: q.dequantize(torch.bfloat16, apply_global_scale=False)  # noqa: E731
            set_compiled(False)
            eager_ms, out = time_ms(fn, x, repeats)
            fast_ms = None
            if label.startswith(TWINNED) and device.type == "cuda":
                set_compiled(True)
                fast_ms, _ = time_ms(fn, x, repeats)
            elif compile_cpu and device.type == "cpu" and not label.startswith("NVFP4Tensor"):
                compiled_fn = torch.compile(fn, dynamic=False)
                fast_ms, _ = time_ms(compiled_fn, x, repeats)
            gb = nbytes(x) + nbytes(out)
            row = f"{label:38s} {f'{rows}x{cols}':>11s} {eager_ms:9.2f} {gb / (eager_ms * 1e6):7.2f}"
            if fast_ms is not None:
                row += f" {fast_ms:12.2f} {gb / (fast_ms * 1e6):7.2f} {eager_ms / fast_ms:7.2f}x"
            else:
                row += f" {'-':>12s} {'-':>7s} {'-':>8s}"
            print(row, flush=True)
        del x, q
    os.environ.pop(compiled.ENV_VAR, None)


def parse_shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: {text!r} is not ROWSxCOLS (e.g. 4096x512)") from None
    return rows, cols


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", nargs="+", help="devices (default: cpu, and cuda if present)")
    parser.add_argument("--shapes", type=parse_shape, nargs="+",
                        help="ROWSxCOLS (default: 4096x512 and 4096x4096 on CPU; 4096x4096 and 8192x8192 on CUDA)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 7 CPU, 20 CUDA)")
    parser.add_argument("--compile-cpu", action="store_true", help="also time torch.compile of each case on CPU")
    args = parser.parse_args()

    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    for device in map(torch.device, devices):
        cuda = device.type == "cuda"
        shapes = args.shapes or ([(4096, 4096), (8192, 8192)] if cuda else [(4096, 512), (4096, 4096)])
        bench_device(device, shapes, getattr(torch, args.dtype), args.repeats or (20 if cuda else 7), args.compile_cpu)


if __name__ == "__main__":
    main()
