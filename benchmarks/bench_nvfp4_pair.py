"""The two NVFP4 copies of a linear's operand, as the trainer makes them on CUDA, timed alone.

    python -m benchmarks.bench_nvfp4_pair                          # hybrid_1b's shapes: 16384 tokens x 2048, 8192
    ncu --clock-control none -k regex:_rht --section SpeedOfLight --section WarpStateStats \\
        python -m benchmarks.bench_nvfp4_pair --once                # each kernel once, for Nsight Compute
    python -m benchmarks.bench_nvfp4_pair --device cpu --shapes 64x32  # Triton's interpreter: a smoke run

`nvfp4.quantize_rowwise_and_rht_t` of x (RNE: the dense rowwise Fprop operand and the packed RHT Wgrad
operand) and of dY (stochastic rounding: both dense), beside a copy and a transposing copy of the same
tensor. CUDA times are medians of `triton.testing.do_bench` over the whole call, host launches included:
at small shapes the host can dominate, so read kernel times from the profiler there. On CPU the kernels run
in Triton's interpreter (TRITON_INTERPRET=1 is set before triton is imported): not a speed figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def cases(shapes, device: torch.device):
    from nvfp4train.formats import nvfp4

    generator = torch.Generator(device=device).manual_seed(1)
    for tokens, features in shapes:
        x = torch.randn(tokens, features, device=device).to(torch.bfloat16)
        yield (
            f"x rne {tokens}x{features}",
            lambda x=x: nvfp4.quantize_rowwise_and_rht_t(
                x, "rne", rowwise_dense=True, out_dtype=torch.bfloat16, impl="triton"
            ),
        )
        yield (
            f"dy sr {tokens}x{features}",
            lambda x=x: nvfp4.quantize_rowwise_and_rht_t(
                x, "sr", generator, rowwise_dense=True, columnwise_dense=True, out_dtype=torch.bfloat16, impl="triton"
            ),
        )
        yield f"copy {tokens}x{features}", lambda x=x: x.clone()
        yield f"transposing copy {tokens}x{features}", lambda x=x: x.t().contiguous()


def time_us(fn, device: torch.device) -> float:
    if device.type == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=50, rep=300) * 1e3
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def parse_shape(text: str) -> tuple[int, int]:
    tokens, _, features = text.partition("x")
    if not (tokens.isdigit() and features.isdigit() and int(tokens) % 16 == 0 and int(features) % 16 == 0):
        raise argparse.ArgumentTypeError(f"shape {text!r}: TOKENSxFEATURES, both multiples of 16 (e.g. 16384x2048)")
    return int(tokens), int(features)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=[(16384, 2048), (16384, 8192)],
        help="tokens x features, both multiples of 16",
    )
    ap.add_argument("--once", action="store_true", help="run each case once, untimed (for a profiler)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--device cpu: triton was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import (the formats import it lazily)
    elif not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU here (--device cpu runs the kernels in Triton's interpreter)")
    device = torch.device(args.device)
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu, Triton's interpreter"
    print(f"{'case':34s} {'us':>10s}   ({gpu})")
    for name, fn in cases(args.shapes, device):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if not args.once:
            print(f"{name:34s} {time_us(fn, device):10.1f}", flush=True)


if __name__ == "__main__":
    main()
