"""Time quantized linears (forward + backward) per precision preset against BF16.

    python -m benchmarks.bench_precision                       # one layer; CPU, small shapes
    python -m benchmarks.bench_precision --device cuda --tokens 16384 --in-features 4096 --out-features 4096
    python -m benchmarks.bench_precision --mlp                 # GPU: 4 x (2048 -> 8192 -> 2048), 16384 tokens

One layer (default): median ms per forward+backward under BF16 autocast, the slowdown against
nn.Linear on the same shapes, the backend the preset resolves to here, and the saved-activation
bytes against nn.Linear's (what the layer keeps between forward and backward).

--mlp: a residual MLP stack, every block quantized, eager and under torch.compile: median ms per
forward+backward (each iteration one optimizer step's worth: the quantized weights are dropped
and rebuilt, `--micro-batches` forward+backward passes share them), TFLOP/s of the model's
6 x params x tokens, the slowdown against BF16 (eager / compiled) and the peak memory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

from nvfp4train.precision import PrecisionPolicy, build_linear_factory, saved_activation_bytes

PRESETS = ("bf16", "fp8_tensorwise", "fp8_blockwise", "nvfp4", "nvfp4_no_rht", "nvfp4_no_2d", "mxfp4")


def load(name: str, backend: str | None) -> PrecisionPolicy:
    from nvfp4train.config import load_preset

    cfg = load_preset("precision", name)
    # One block, fully quantized: zero the BF16 block counts.
    cfg.update(bf16_first=0, bf16_last=0)
    if backend:
        cfg["backend"] = backend
    return PrecisionPolicy.from_dict(cfg)


def time_layer(layer, x, grad, iters: int, warmup: int = 2) -> float:
    def once():
        xx = x.detach().requires_grad_(True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y = layer(xx)
        y.backward(grad)
        layer.weight.grad = None

    for _ in range(warmup):
        once()
    times = []
    for _ in range(iters):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        once()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class MLPStack(nn.Module):
    """x <- x + fc2(gelu(fc1(x))), `blocks` times; the loss is the mean square of the output."""

    def __init__(self, factory, blocks: int, d: int, hidden: int):
        super().__init__()
        self.fc1 = nn.ModuleList(factory.linear(d, hidden, block_index=i, name="fc1") for i in range(blocks))
        self.fc2 = nn.ModuleList(factory.linear(hidden, d, block_index=i, name="fc2") for i in range(blocks))

    def forward(self, x):
        for fc1, fc2 in zip(self.fc1, self.fc2):
            x = x + fc2(torch.nn.functional.gelu(fc1(x)))
        return x.float().square().mean()


def bench_mlp(args, device) -> None:
    from nvfp4train.precision import PrecisionController

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.tokens, args.d_model, device=device, generator=g, dtype=torch.bfloat16)
    flops = 6 * 2 * args.d_model * args.hidden * args.blocks * args.tokens * args.micro_batches
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU x{torch.get_num_threads()} threads"
    print(
        f"{name}, torch {torch.__version__}; MLP {args.blocks} x ({args.d_model} -> {args.hidden} -> {args.d_model}), "
        f"{args.tokens} tokens, {args.micro_batches} micro-batch(es) per weight update, every block quantized"
    )
    print(f"{'preset':<16} {'backend':<10} {'mode':<9} {'ms':>9} {'TFLOP/s':>8} {'x bf16':>7} {'peak GiB':>9}")
    base = {}
    for preset in ["bf16"] + [p for p in args.presets.split(",") if p != "bf16"]:
        policy = load(preset, args.backend)
        factory = build_linear_factory(policy, n_blocks=args.blocks, seed=0)
        torch.manual_seed(0)
        model = MLPStack(factory, args.blocks, args.d_model, args.hidden).to(device)
        ctl = PrecisionController(policy, model)
        for mode in ("eager", "compiled"):
            forward = torch.compile(model) if mode == "compiled" else model

            def step():
                ctl.weights_changed()  # one optimizer step's worth: weights quantized anew
                for _ in range(args.micro_batches):
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        loss = forward(x)
                    loss.backward()
                for p in model.parameters():
                    p.grad = None

            try:
                ms, peak = time_fn(step, device, args.iters)
            except Exception as error:  # noqa: BLE001 - one row per failure, keep going
                print(
                    f"{preset:<16} {factory.backend_name:<10} {mode:<9} "
                    f"failed: {type(error).__name__}: {str(error)[:120]}"
                )
                continue
            base.setdefault(mode, ms) if preset == "bf16" else None
            ratio = ms / base[mode] if mode in base else float("nan")
            print(
                f"{preset:<16} {factory.backend_name:<10} {mode:<9} {ms:>9.2f} {flops / ms / 1e9:>8.0f} {ratio:>7.2f} "
                f"{peak / 2**30:>9.2f}",
                flush=True,
            )


def time_fn(fn, device, iters: int, warmup: int = 3) -> tuple[float, int]:
    """(median ms of fn(), peak memory allocated during the timed calls; 0 off CUDA)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--in-features", type=int, default=512)
    parser.add_argument("--out-features", type=int, default=512)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--backend", default=None, help="override every preset's backend (auto|emulated|scaled_mm|te)")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads on CPU")
    parser.add_argument(
        "--mlp", action="store_true", help="time the MLP stack (eager and compiled) instead of one layer"
    )
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--micro-batches", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    if args.mlp:
        if "--tokens" not in sys.argv:
            args.tokens = 16384
        bench_mlp(args, device)
        return
    x = torch.randn(args.tokens, args.in_features, device=device, dtype=torch.bfloat16)
    grad = torch.randn(args.tokens, args.out_features, device=device, dtype=torch.bfloat16)
    reference = nn.Linear(args.in_features, args.out_features, bias=False, device=device)
    base_ms = time_layer(reference, x, grad, args.iters)
    base_bytes = saved_activation_bytes(reference, x)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU x{torch.get_num_threads()} threads"
    print(
        f"{name}, torch {torch.__version__}; tokens={args.tokens} in={args.in_features} out={args.out_features}; "
        f"nn.Linear fwd+bwd {base_ms:.3f} ms, saved {base_bytes / 2**20:.2f} MiB"
    )
    print(f"{'preset':<16} {'backend':<10} {'ms':>9} {'x nn.Linear':>12} {'saved MiB':>10} {'x bf16 saved':>13}")
    for preset in args.presets.split(","):
        policy = load(preset, args.backend)
        factory = build_linear_factory(policy, n_blocks=1, seed=0)
        layer = factory.linear(args.in_features, args.out_features, block_index=0, name="fc1").to(device)
        ms = time_layer(layer, x, grad, args.iters)
        saved = saved_activation_bytes(layer, x)
        print(
            f"{preset:<16} {factory.backend_name:<10} {ms:>9.3f} {ms / base_ms:>12.2f} "
            f"{saved / 2**20:>10.2f} {saved / base_bytes:>13.3f}"
        )


if __name__ == "__main__":
    main()
