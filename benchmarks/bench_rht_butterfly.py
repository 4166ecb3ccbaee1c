"""The Wgrad operand's 16-point RHT along tokens in Triton: the trainer's index-order sum against a
Walsh-Hadamard butterfly, beside a transposing copy of the same bytes.

    python -m benchmarks.bench_rht_butterfly                        # CUDA: 16384x4096 and 8192x8192 bf16
    python -m benchmarks.bench_rht_butterfly --shapes 8192x2048 --blocks 4,64 2,128
    python -m benchmarks.bench_rht_butterfly --device cpu --shapes 128x256 --repeats 1   # bits only
    python -m benchmarks.bench_rht_butterfly --sass      # sm_90a instructions per element, no GPU needed

Each kernel reads x [tokens, features] (bf16) and writes [features, tokens] (bf16), a program taking
GROUPS groups of 16 tokens x BLOCK_F features:

- ``index order``: ``kernels.rht._rht_tokens``, the transform of the fused NVFP4 Wgrad kernels: per
  output 16 multiply-adds in index order (``hadamard.rht``'s arithmetic, TE's reference);
- ``butterfly``: the signs and 1/4 applied (exact), then 4 stages of additions and subtractions (pairs
  j, j + h for h = 1, 2, 4, 8: ``benchmarks.rht_sum_order.butterfly``'s order), 4 operations an element;
- ``register butterfly``: the same arithmetic, the tokens loaded one by one as ``_rht_tokens`` loads them
  and each stage on named registers (no reshapes of the tile);
- ``transposing copy``: the same loads and stores, no arithmetic: the memory bound of this layout.

So the table says how far the index order is from the bound and whether a butterfly reaches it. The
butterfly's bits are not the reference's (``python -m benchmarks.rht_sum_order``: about one element in a
million differs on a trained model's operands; TE's golden RHT cases agree under both orders): the
trainer does not use it. Each kernel's output is checked against its CPU definition first. On CPU the
kernels run in Triton's interpreter: a check of the bits, not a speed figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shapes", nargs="+", default=["16384x4096", "8192x8192"], help="TOKENSxFEATURES")
    ap.add_argument("--blocks", nargs="+", default=["4,64"], help="GROUPS,BLOCK_F[,WARPS] per program")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument(
        "--sass",
        action="store_true",
        help="print each kernel's sm_90a instructions per element "
        "(formats/kernels/sm90.py: compiled here, no GPU) for the first --blocks, and stop",
    )
    return ap.parse_args(argv)


KERNELS = ("index order", "butterfly", "register butterfly", "transposing copy")


def _kernel(k, name: str):
    return getattr(k, name.replace(" ", "_"))


def print_sass(blocks_text: str) -> None:
    """Instructions per element of each kernel as an H100 would run it (the trainer's launch: bf16, aligned)."""
    from benchmarks import rht_butterfly_kernels as k
    from nvfp4train.formats import hadamard
    from nvfp4train.formats.kernels import rht, sm90

    groups, block_f, *warps = (int(v) for v in blocks_text.split(","))
    warps = warps[0] if warps else rht.program_blocks(1 << 20, 16, (groups, block_f))[2]
    signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n_tokens": "i32", "n_features": "i32"}
    constexprs = {
        "SIGN_MASK": rht.sign_mask(hadamard.resolve_signs(16)),
        "GROUPS": groups,
        "BLOCK_F": block_f,
        "HW_BF16": True,
    }
    print(f"| kernel (blocks {blocks_text}) | SASS | per element | top opcodes |")
    print("|---|---|---|---|")
    for name in KERNELS:
        variant = sm90.Variant(_kernel(k, name), signature, constexprs, groups * 16 * block_f, warps)
        ops = sm90.sass_opcodes(variant)
        total, per_thread = sum(ops.values()), variant.elements // (32 * warps)
        top = " ".join(f"{op} {n}" for op, n in ops.most_common(5))
        print(f"| {name} | {total} | {total / per_thread:.1f} | {top} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.sass:
        sys.path.insert(0, str(ROOT))
        return print_sass(args.blocks[0])
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernels run on the CPU
    elif not torch.cuda.is_available():
        sys.exit("bench_rht_butterfly: --device cuda: no CUDA device here (--device cpu checks the bits)")
    sys.path.insert(0, str(ROOT))
    import triton

    from benchmarks import rht_butterfly_kernels as k
    from benchmarks.bench_quant import time_ms
    from benchmarks.rht_sum_order import butterfly
    from nvfp4train.formats import hadamard
    from nvfp4train.formats.kernels.common import launch_options
    from nvfp4train.formats.kernels.rht import sign_mask

    signs = hadamard.resolve_signs(16)
    mask_bits = sign_mask(signs)
    kernels = {name: _kernel(k, name) for name in KERNELS}
    device = torch.device(args.device)
    hw_bf16 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)

    def launch(kernel, x, blocks):
        groups, block_f, *warps = blocks
        y = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)
        options = launch_options(x)
        if warps and x.is_cuda:
            options["num_warps"] = warps[0]
        grid = (triton.cdiv(x.shape[0], groups * 16), triton.cdiv(x.shape[1], block_f))
        kernel[grid](
            x,
            y,
            x.shape[0],
            x.shape[1],
            SIGN_MASK=mask_bits,
            GROUPS=groups,
            BLOCK_F=block_f,
            HW_BF16=hw_bf16,
            **options,
        )
        return y

    print("| shape | blocks | kernel | ms | GB/s (read + write) | vs transposing copy |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes:
        tokens, features = (int(v) for v in shape.lower().split("x"))
        if tokens % 16:
            sys.exit(f"bench_rht_butterfly: --shapes {shape}: tokens must be a multiple of 16")
        x = torch.randn(tokens, features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        x = x.to(device)
        cpu_t = x.t().contiguous().cpu()
        want = {
            "index order": hadamard.rht(cpu_t, 16, signs, impl="reference"),
            "butterfly": butterfly(cpu_t.reshape(-1, 16).float(), signs.float()).to(x.dtype).reshape(cpu_t.shape),
            "register butterfly": None,  # the same as butterfly's
            "transposing copy": cpu_t,
        }
        for blocks_text in args.blocks:
            blocks = tuple(int(v) for v in blocks_text.split(","))
            times = {}
            for name, kernel in kernels.items():
                got = launch(kernel, x, blocks).cpu()
                expected = want[name] if want[name] is not None else want["butterfly"]
                if not torch.equal(got.view(torch.int16), expected.view(torch.int16)):
                    sys.exit(
                        f"bench_rht_butterfly: {name} {shape} blocks {blocks_text}: "
                        f"{int((got != expected).sum())} elements differ from its definition"
                    )
                times[name] = time_ms(lambda kernel=kernel: launch(kernel, x, blocks), args.repeats, device)
            for name, ms in times.items():
                gbps = 2 * x.numel() * x.element_size() / ms / 1e6
                print(
                    f"| {tokens}x{features} | {blocks_text} | {name} | {ms:.3f} | {gbps:.0f} | "
                    f"{times['transposing copy'] / ms:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
