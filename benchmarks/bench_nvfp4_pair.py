"""The two NVFP4 copies of a linear's operand, as the trainer makes them on CUDA, timed alone.

    python -m benchmarks.bench_nvfp4_pair                          # hybrid_1b's shapes: 16384 tokens x 2048, 8192
    ncu --clock-control none -k regex:_rht --section SpeedOfLight --section WarpStateStats \\
        python -m benchmarks.bench_nvfp4_pair --once                # each kernel once, for Nsight Compute

`nvfp4.quantize_rowwise_and_rht_t` of x (RNE: the dense rowwise Fprop operand and the packed RHT Wgrad
operand) and of dY (stochastic rounding: both dense), beside a copy and a transposing copy of the same
tensor. Times are CUDA-event medians of the whole call (`triton.testing.do_bench`), host launches included:
at the smaller shape the host can dominate, so read kernel times from the profiler there.
"""

from __future__ import annotations

import argparse

import torch
import triton

from nvfp4train.formats import nvfp4


def cases(shapes):
    generator = torch.Generator(device="cuda").manual_seed(1)
    for tokens, features in shapes:
        x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["16384x2048", "16384x8192"], help="tokens x features")
    ap.add_argument("--once", action="store_true", help="run each case once, untimed (for a profiler)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_nvfp4_pair: needs a CUDA GPU")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    torch.manual_seed(0)
    print(f"{'case':34s} {'us':>9s}   ({torch.cuda.get_device_name()})")
    for name, fn in cases(shapes):
        fn()
        torch.cuda.synchronize()
        if not args.once:
            print(f"{name:34s} {triton.testing.do_bench(fn, warmup=50, rep=300) * 1e3:9.1f}", flush=True)


if __name__ == "__main__":
    main()
