"""Time a quantized linear layer (forward + backward) per precision preset against nn.Linear.

    python scripts/bench_precision.py                       # CPU, small shapes
    python scripts/bench_precision.py --device cuda --tokens 16384 --in-features 4096 --out-features 4096

Each row: median ms per forward+backward under BF16 autocast, the slowdown against nn.Linear on
the same shapes, the backend the preset resolves to here, and the saved-activation bytes against
nn.Linear's (what the layer keeps between forward and backward).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvfp4train.precision import PrecisionPolicy, build_linear_factory, saved_activation_bytes  # noqa: E402

PRESETS = ("bf16", "fp8_tensorwise", "fp8_blockwise", "nvfp4", "nvfp4_no_rht", "nvfp4_no_2d", "mxfp4")


def load(name: str, backend: str | None) -> PrecisionPolicy:
    from nvfp4train.train.config import load_preset

    cfg = load_preset("precision", name)
    # One block, fully quantized: zero the BF16 block counts.
    for key in ("bf16_first_blocks", "bf16_last_blocks", "bf16_first_fraction", "bf16_last_fraction"):
        if key in cfg:
            cfg[key] = 0
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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    x = torch.randn(args.tokens, args.in_features, device=device, dtype=torch.bfloat16)
    grad = torch.randn(args.tokens, args.out_features, device=device, dtype=torch.bfloat16)
    reference = nn.Linear(args.in_features, args.out_features, bias=False, device=device)
    base_ms = time_layer(reference, x, grad, args.iters)
    base_bytes = saved_activation_bytes(reference, x)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU x{torch.get_num_threads()} threads"
    print(f"{name}, torch {torch.__version__}; tokens={args.tokens} in={args.in_features} out={args.out_features}; "
          f"nn.Linear fwd+bwd {base_ms:.3f} ms, saved {base_bytes / 2**20:.2f} MiB")
    print(f"{'preset':<16} {'backend':<10} {'ms':>9} {'x nn.Linear':>12} {'saved MiB':>10} {'x bf16 saved':>13}")
    for preset in args.presets.split(","):
        policy = load(preset, args.backend)
        factory = build_linear_factory(policy, n_blocks=1, seed=0)
        layer = factory(args.in_features, args.out_features, block_index=0, name="fc1").to(device)
        ms = time_layer(layer, x, grad, args.iters)
        saved = saved_activation_bytes(layer, x)
        print(f"{preset:<16} {factory.backend_name:<10} {ms:>9.3f} {ms / base_ms:>12.2f} {saved / 2**20:>10.2f} {saved / base_bytes:>13.3f}")


if __name__ == "__main__":
    main()
