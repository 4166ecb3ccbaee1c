"""Time the Mamba mixer's non-GEMM kernels of ours at a model's shapes, beside a device copy (CUDA only).

    python -m benchmarks.bench_mixer                          # hybrid_1b, 4 x 4096 tokens
    python -m benchmarks.bench_mixer --model hybrid_350m --batch 8 --seq 2048
    python -m benchmarks.bench_mixer --conv-rows 32,256,2 64,256,2 64,512,4 --norm-warps 4 16 32 64

Rows:
- causal conv1d + SiLU forward and backward (model/causal_conv.py), K = 4: the tile kernels (what K != 4
  runs, and what K = 4 ran before the row kernels) and the row kernels at the default and at each
  ``--conv-rows ROWS,BC,WARPS``;
- the RMSNorm backward and the gated RMSNorm backward (model/fused_norm.py): mamba-ssm's own launcher and
  ours at each ``--norm-warps`` (warps per SM of the grid).

GB/s counts the bytes a kernel must move (inputs read once, outputs written once); ``of copy`` divides it
by ``dst.copy_(src)``'s GB/s of a bf16 tensor of the conv input's size in the same run. Prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def bench(fn, repeats: int = 50) -> float:
    """Median milliseconds of fn() (triton.testing.do_bench: L2 flushed between calls)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=repeats, return_mode="median")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hybrid_1b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--conv-rows", nargs="*", default=[], help="ROWS,BC,WARPS of the K=4 row kernels")
    parser.add_argument("--norm-warps", nargs="*", type=int, default=[16, 32, 64])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_mixer.py times CUDA kernels: no CUDA device here")

    import triton
    import yaml

    from nvfp4train.model import causal_conv as cc
    from nvfp4train.model import fused_norm
    from nvfp4train.model.config import ModelConfig
    from nvfp4train.model.ops import gated_norm_kernels

    cfg = ModelConfig.from_dict(yaml.safe_load((ROOT / "configs" / "model" / f"{args.model}.yaml").read_text()))
    d_inner, conv_dim = cfg.mamba_d_inner, cfg.mamba_conv_dim
    b, T, C, dev = args.batch, args.seq, conv_dim, torch.device("cuda")
    rows = []

    def row(name: str, ms: float, nbytes: int) -> None:
        rows.append({"kernel": name, "ms": ms, "gbps": nbytes / ms / 1e6})

    elems = b * T * C
    src, dst = (
        torch.randn(elems, device=dev, dtype=torch.bfloat16),
        torch.empty(elems, device=dev, dtype=torch.bfloat16),
    )
    copy_ms = bench(lambda: dst.copy_(src))
    row("copy (bf16, conv input's size)", copy_ms, 4 * elems)

    # the conv: x a strided slice of in_proj's output, as in the mixer
    d_in_proj = cfg.mamba_in_proj_dim
    zx = torch.randn(b, T, d_in_proj, device=dev, dtype=torch.bfloat16)
    x = zx[:, :, d_inner : d_inner + C]
    w = torch.randn(C, 1, 4, device=dev) * 0.3
    bias = torch.randn(C, device=dev) * 0.1
    dy = torch.randn(b, T, C, device=dev, dtype=torch.bfloat16)
    io_fwd, io_bwd = 4 * elems, 6 * elems  # bf16: x in, y out; x, dy in, dx out

    def tile_fwd():
        y = torch.empty(b, T, C, device=dev, dtype=torch.bfloat16)
        cc._conv_silu_fwd_kernel[(b, triton.cdiv(T, cc.BLOCK_T), triton.cdiv(C, cc.BLOCK_C))](
            x, w, bias, y, T, C, x.stride(0), x.stride(1), K=4, BT=cc.BLOCK_T, BC=cc.BLOCK_C, num_warps=4
        )

    def tile_bwd():
        n_t = triton.cdiv(T, cc.BLOCK_T)
        dx = torch.empty(b, T, C, device=dev, dtype=torch.bfloat16)
        dw, db = torch.empty(b * n_t, C, 4, device=dev), torch.empty(b * n_t, C, device=dev)
        cc._conv_silu_bwd_kernel[(b, n_t, triton.cdiv(C, cc.BLOCK_C))](
            x,
            w,
            bias,
            dy,
            dx,
            dw,
            db,
            T,
            C,
            x.stride(0),
            x.stride(1),
            dx.stride(0),
            dx.stride(1),
            n_t,
            K=4,
            BT=cc.BLOCK_T,
            BC=cc.BLOCK_C,
            num_warps=4,
        )
        dw.sum(0), db.sum(0)

    row("conv fwd, tile kernel", bench(tile_fwd), io_fwd)
    row("conv bwd, tile kernel", bench(tile_bwd), io_bwd)
    configs = [(cc.ROWS4, cc.BLOCK_C4, cc.WARPS4)] + [tuple(int(v) for v in c.split(",")) for c in args.conv_rows]
    saved = cc.ROWS4, cc.BLOCK_C4, cc.WARPS4
    for config in dict.fromkeys(configs):
        cc.ROWS4, cc.BLOCK_C4, cc.WARPS4 = config
        label = "default" if config == saved else "rows,bc,warps=" + ",".join(map(str, config))
        row(f"conv fwd, row kernel ({label})", bench(lambda: cc.conv_silu_forward(x, w, bias)), io_fwd)
        row(f"conv bwd, row kernel ({label})", bench(lambda: cc.conv_silu_backward(dy, x, w, bias)), io_bwd)
    cc.ROWS4, cc.BLOCK_C4, cc.WARPS4 = saved

    # the norms: the residual stream's RMSNorm (d_model) and the mixer's gated RMSNorm (d_inner, groups)
    mamba = gated_norm_kernels()
    M = b * T
    for label, N, group in (
        ("rmsnorm", cfg.d_model, cfg.d_model),
        ("gated rmsnorm", d_inner, d_inner // cfg.mamba_groups),
    ):
        xn, dyn = (torch.randn(M, N, device=dev, dtype=torch.bfloat16) for _ in range(2))
        z = torch.randn(M, N, device=dev, dtype=torch.bfloat16) if group < N else None
        wn = torch.rand(N, device=dev) + 0.5
        _, _, rstd = mamba._layer_norm_fwd(
            xn, wn, None, 1e-5, z=z, group_size=group, norm_before_gate=False, is_rms_norm=True
        )
        io = 2 * M * N * (3 if z is None else 5)  # x, dy in, dx out (+ z in, dz out)
        row(
            f"{label} bwd, mamba-ssm launcher",
            bench(lambda: mamba._layer_norm_bwd(dyn, xn, wn, None, 1e-5, None, rstd, z, group, False, True)),
            io,
        )
        for warps in args.norm_warps:
            row(
                f"{label} bwd, {warps} warps/SM",
                bench(lambda: fused_norm.rms_norm_backward(dyn, xn, wn, z, rstd, 1e-5, group, warps_per_sm=warps)),
                io,
            )

    print(f"{torch.cuda.get_device_name()}; {args.model}, {b} x {T} tokens, conv channels {C}")
    print(f"{'kernel':<48} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    copy_gbps = rows[0]["gbps"]
    for r in rows:
        print(f"{r['kernel']:<48} {r['ms']:>8.3f} {r['gbps']:>8.0f} {r['gbps'] / copy_gbps:>8.0%}")
    return rows


if __name__ == "__main__":
    main()
