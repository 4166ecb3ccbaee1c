"""Bandwidth of the nvfp4train.formats quantizers, reference vs Triton, beside a device copy.

    python -m benchmarks.bench_quant                              # CUDA: 8192x8192 and 16384x4096 bf16
    python -m benchmarks.bench_quant --device cpu --shapes 64x256 --repeats 2 --out /tmp/quant.json
    python -m benchmarks.bench_quant --rht-blocks 4,64 4,64,8 2,128   # sweep the fused RHT kernels' blocks
    python -m benchmarks.bench_quant --weight-pair --dtype float32 --shapes 2048x8192 8192x2048 2048x4096

GB/s counts the bytes a quantizer must move: its input read once plus its outputs written (packed
codes + scales for ``quantize``, the dense values for ``fake_quantize``). The copy column is
``dst.copy_(src)`` of the same input in the same run (2 x its bytes), so ``frac_of_copy`` says how
close a quantizer comes to the memory bound. (The NVFP4 kernels read the input twice, once for the
global amax, which the count leaves out: their ceiling is below 1.)

``--rht-blocks G,F[,W] ...`` times only the fused Wgrad kernels (``nvfp4.rht_quantize_t`` and
``mxfp4.rht_quantize_t``, Triton, RNE and SR) with G groups of 16 / 32 tokens x F features per program
on W warps (default G x F / 64, 1 to 8), a row per kernel, rounding and block shape (the quantizer's
name ends in ``blocks=GxF`` or ``blocks=GxF warps=W``); the bits do not depend on it.

``--weight-pair`` times only a 4over6 weight's two copies (16x16 tiles, MAE, bound 256: Fprop's W and Dgrad's
Wᵀ), dense bf16 (what training makes) and packed: ``nvfp4.quantize_tiles_rowcol`` (one read of W, both copies)
against two separate calls on W and W.T, the second with the transposed copy of W the separate path makes.
``--dtype float32`` quantizes an FP32 tensor, as training quantizes its FP32 master weights (default bfloat16).

Rows are printed as a table and merged into ``--out`` (default docs/results/bench/quant.json), one
row per quantizer x shape x impl: {quantizer, shape, impl, ms, gbps, copy_gbps, frac_of_copy, gpu,
commit}; a re-run replaces its rows. On CPU, "triton" runs in Triton's interpreter
(TRITON_INTERPRET=1 is set before triton is imported): a correctness smoke run, not a speed figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from nvfp4train.data.paths import git_commit
from nvfp4train.formats import fp8, mxfp4, nvfp4, sr_generator

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results" / "bench" / "quant.json"
IMPLS = ("reference", "triton")


def nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (tuple, list)):  # the outputs; a 0-d global scale counts 4 bytes
        return sum(nbytes(u) for u in t)
    if isinstance(t, (nvfp4.NVFP4Tensor, mxfp4.MXFP4Tensor)):
        return nbytes(t.codes) + nbytes(t.scales)
    raise TypeError(type(t))


def _blocks_label(blocks: tuple[int, ...]) -> str:
    return f"blocks={blocks[0]}x{blocks[1]}" + (f" warps={blocks[2]}" if len(blocks) == 3 else "")


def weight_pair_cases():
    """(name, fn(x, impl)): a 4over6 weight's W and Wᵀ (16x16, MAE, bound 256), from one pass and from two calls."""
    options = {"four_over_six": "mae", "scale_bound": 256}
    bf16 = torch.bfloat16

    def two_calls(x, i, dense):
        if dense:
            return tuple(nvfp4.fake_quantize(t, (16, 16), out_dtype=bf16, impl=i, **options) for t in (x, x.t()))
        return tuple(nvfp4.quantize(t, (16, 16), impl=i, **options) for t in (x, x.t()))

    return [
        (
            "nvfp4 4over6 W+Wt dense: quantize_tiles_rowcol",
            lambda x, i: nvfp4.quantize_tiles_rowcol(x, "mae", 256, dense=True, out_dtype=bf16, impl=i),
        ),
        ("nvfp4 4over6 W+Wt dense: two fake_quantize", lambda x, i: two_calls(x, i, True)),
        ("nvfp4 4over6 W+Wt packed: quantize_tiles_rowcol", lambda x, i: nvfp4.quantize_tiles_rowcol(x, impl=i)),
        ("nvfp4 4over6 W+Wt packed: two quantize", lambda x, i: two_calls(x, i, False)),
    ]


def cases(device: torch.device, rht_blocks=None, weight_pair: bool = False):
    """(name, fn(x, impl)) for every quantizer with a Triton kernel; with ``rht_blocks`` (a list of
    (groups, features[, warps])), the fused Wgrad kernels at each block shape instead; with ``weight_pair``, only
    a 4over6 weight's two copies (``weight_pair_cases``)."""
    if weight_pair:
        return weight_pair_cases()
    gen = lambda: sr_generator(0, 0, device)  # noqa: E731
    bf16 = torch.bfloat16
    if rht_blocks:  # RNE (the activations' Wgrad operand) and SR (the gradients')
        return [
            (
                f"{name}.rht_quantize_t {tile} {rounding} {_blocks_label(b)}",
                lambda x, i, fmt=fmt, r=rounding, b=b: fmt.rht_quantize_t(
                    x, r, gen() if r == "sr" else None, impl=i, blocks=b
                ),
            )
            for b in rht_blocks
            for name, fmt, tile in (("nvfp4", nvfp4, "1x16"), ("mxfp4", mxfp4, "1x32"))
            for rounding in ("rne", "sr")
        ]
    return [
        ("nvfp4.quantize 1x16 rne", lambda x, i: nvfp4.quantize(x, (1, 16), "rne", impl=i)),
        ("nvfp4.quantize 1x16 sr", lambda x, i: nvfp4.quantize(x, (1, 16), "sr", gen(), impl=i)),
        ("nvfp4.quantize 16x16 rne", lambda x, i: nvfp4.quantize(x, (16, 16), "rne", impl=i)),
        # TE's 4over6 and row scaling, to compare with the plain rows above on the same tensor
        (
            "nvfp4.quantize 1x16 4over6-mae b256",
            lambda x, i: nvfp4.quantize(x, four_over_six="mae", scale_bound=256, impl=i),
        ),
        (
            "nvfp4.quantize 16x16 4over6-mae b256",
            lambda x, i: nvfp4.quantize(x, (16, 16), four_over_six="mae", scale_bound=256, impl=i),
        ),
        ("nvfp4.quantize 1x16 row-scaled", lambda x, i: nvfp4.quantize(x, row_scaled=True, impl=i)),
        *weight_pair_cases()[:2],  # a 4over6 weight's W and Wᵀ: one pass against two calls
        ("nvfp4.fake_quantize 1x16 rne", lambda x, i: nvfp4.fake_quantize(x, (1, 16), "rne", out_dtype=bf16, impl=i)),
        ("nvfp4.fake_quantize 1x16 sr", lambda x, i: nvfp4.fake_quantize(x, (1, 16), "sr", gen(), bf16, impl=i)),
        ("nvfp4.fake_quantize 16x16 rne", lambda x, i: nvfp4.fake_quantize(x, (16, 16), out_dtype=bf16, impl=i)),
        ("nvfp4.rht_quantize_t 1x16 rne", lambda x, i: nvfp4.rht_quantize_t(x, "rne", impl=i)),
        ("nvfp4.rht_quantize_t 1x16 sr", lambda x, i: nvfp4.rht_quantize_t(x, "sr", gen(), impl=i)),
        (
            "nvfp4.quantize_rowwise_and_rht_t rne",
            lambda x, i: nvfp4.quantize_rowwise_and_rht_t(x, "rne", rowwise_dense=True, out_dtype=bf16, impl=i),
        ),
        ("mxfp4.quantize rne", lambda x, i: mxfp4.quantize(x, "rne", impl=i)),
        ("mxfp4.rht_quantize_t 1x32 rne", lambda x, i: mxfp4.rht_quantize_t(x, "rne", impl=i)),
        ("mxfp4.rht_quantize_t 1x32 sr", lambda x, i: mxfp4.rht_quantize_t(x, "sr", gen(), impl=i)),
        ("mxfp4.fake_quantize rne", lambda x, i: mxfp4.fake_quantize(x, "rne", out_dtype=bf16, impl=i)[0]),
        (
            "mxfp4.fake_quantize sr",
            lambda x, i: mxfp4.fake_quantize(x, "sr", generator=gen(), out_dtype=bf16, impl=i)[0],
        ),
        ("fp8.quantize_tensorwise", lambda x, i: fp8.quantize_tensorwise(x, impl=i)),
        ("fp8.quantize_blockwise 1x128", lambda x, i: fp8.quantize_blockwise(x, (1, 128), impl=i)),
        ("fp8.quantize_blockwise 128x128", lambda x, i: fp8.quantize_blockwise(x, (128, 128), impl=i)),
        ("fp8.quantize_blockwise_t 1x128", lambda x, i: fp8.quantize_blockwise_t(x, impl=i)),
        ("fp8.quantize_blockwise_rowcol 1x128", lambda x, i: fp8.quantize_blockwise_rowcol(x, impl=i)),
        (
            "fp8.quantize+dequantize 1x128 pow2",  # the emulated GEMM operand: raw form, then bf16 values
            lambda x, i: fp8.dequantize_blockwise(
                *fp8.quantize_blockwise(x, (1, 128), pow2_scales=True), (1, 128), bf16, impl=i
            ),
        ),
        (
            "fp8.fake_quantize_blockwise 1x128 pow2",
            lambda x, i: fp8.fake_quantize_blockwise(x, (1, 128), pow2_scales=True, out_dtype=bf16, impl=i)[0],
        ),
    ]


def time_ms(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up: compiles the kernel
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def sig4(value: float) -> float:
    return float(f"{value:.4g}")


def bench(
    device: torch.device,
    shapes,
    impls,
    repeats: int,
    rht_blocks=None,
    weight_pair: bool = False,
    dtype: torch.dtype = torch.bfloat16,
) -> list[dict]:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rev = git_commit(short=True)
    rows = []
    print(f"# {gpu}, torch {torch.__version__}, {str(dtype).removeprefix('torch.')} input, median of {repeats}")
    print(f"{'quantizer':48s} {'shape':>11s} {'impl':>9s} {'ms':>9s} {'GB/s':>8s} {'copy GB/s':>10s} {'of copy':>8s}")
    for n_rows, n_cols in shapes:
        x = torch.randn(n_rows, n_cols, device=device, dtype=dtype)
        dst = torch.empty_like(x)
        copy_ms = time_ms(lambda: dst.copy_(x), repeats, device)
        copy_gbps = 2 * nbytes(x) / (copy_ms * 1e6)
        shape = f"{n_rows}x{n_cols}" + ("" if dtype == torch.bfloat16 else f" {str(dtype).removeprefix('torch.')}")
        for name, fn in cases(device, rht_blocks, weight_pair):
            for impl in impls:
                out = fn(x, impl)
                ms = time_ms(lambda: fn(x, impl), repeats, device)
                gbps = (nbytes(x) + nbytes(out)) / (ms * 1e6)
                row = {
                    "quantizer": name,
                    "shape": shape,
                    "impl": impl,
                    "ms": sig4(ms),
                    "gbps": sig4(gbps),
                    "copy_gbps": sig4(copy_gbps),
                    "frac_of_copy": sig4(gbps / copy_gbps),
                    "gpu": gpu,
                    "commit": rev,
                }
                rows.append(row)
                print(
                    f"{name:48s} {shape:>11s} {impl:>9s} {ms:9.3f} {gbps:8.2f} {copy_gbps:10.2f} "
                    f"{gbps / copy_gbps:8.1%}",
                    flush=True,
                )
    return rows


def merge(path: Path, rows: list[dict]) -> None:
    """Replace the rows with the same (quantizer, shape, impl, GPU), keep the others: each GPU model keeps its own."""
    old = json.loads(path.read_text()) if path.exists() else []
    key = lambda r: (r["quantizer"], r["shape"], r["impl"], r.get("gpu") or "")  # noqa: E731
    new_keys = {key(r) for r in rows}
    merged = [r for r in old if key(r) not in new_keys] + rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sorted(merged, key=key), indent=1) + "\n")


def parse_shape(text: str) -> tuple[int, int]:
    try:
        n_rows, n_cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: {text!r} is not ROWSxCOLS (e.g. 8192x8192)") from None
    if n_rows % 128 or n_cols % 128:
        raise argparse.ArgumentTypeError(f"--shapes: {text!r}: both sizes must be multiples of 128 (FP8 128x128 tiles)")
    return n_rows, n_cols


def parse_blocks(text: str) -> tuple[int, ...]:
    try:
        blocks = tuple(int(v) for v in text.split(","))
    except ValueError:
        blocks = ()
    if len(blocks) not in (2, 3):
        raise argparse.ArgumentTypeError(f"--rht-blocks: {text!r} is not GROUPS,FEATURES[,WARPS] (e.g. 4,64 or 4,64,8)")
    if not all(v >= 1 and v & (v - 1) == 0 for v in blocks):
        raise argparse.ArgumentTypeError(f"--rht-blocks: {text!r}: every number must be a power of two")
    return blocks


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        help="ROWSxCOLS, multiples of 128 (default: 8192x8192 16384x4096 on CUDA, 128x256 on CPU)",
    )
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 20 CUDA, 3 CPU)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"JSON to merge rows into (default {DEFAULT_OUT.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--rht-blocks",
        type=parse_blocks,
        nargs="+",
        metavar="G,F[,W]",
        help="time only nvfp4/mxfp4.rht_quantize_t (Triton, RNE and SR) with G token groups x F "
        "features per program on W warps (default G*F/64), a row per kernel and block shape "
        "(e.g. --rht-blocks 4,64 4,64,8 2,128)",
    )
    parser.add_argument(
        "--weight-pair",
        action="store_true",
        help="time only a 4over6 weight's W and Wt copies: nvfp4.quantize_tiles_rowcol against two separate calls",
    )
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="the input's dtype (default bfloat16)"
    )
    args = parser.parse_args(argv)
    if args.rht_blocks and args.weight_pair:
        parser.error("--rht-blocks and --weight-pair each pick their own rows: give one of them")
    if args.rht_blocks:
        if "triton" not in args.impls:
            parser.error("--rht-blocks sets the Triton kernels' block shape: --impls must include triton")
        args.impls = ["triton"]  # the reference has no blocks
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (use --device cpu)")
    if device.type == "cpu" and "triton" in args.impls:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--device cpu with --impls triton: triton was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import (the formats import it lazily)
    shapes = args.shapes or ([(8192, 8192), (16384, 4096)] if device.type == "cuda" else [(128, 256)])
    repeats = args.repeats or (20 if device.type == "cuda" else 3)
    rows = bench(device, shapes, args.impls, repeats, args.rht_blocks, args.weight_pair, getattr(torch, args.dtype))
    merge(args.out, rows)
    print(f"merged {len(rows)} rows into {args.out}")


if __name__ == "__main__":
    main()
