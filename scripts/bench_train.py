"""Throughput and memory of one training step per precision policy, on whatever device is here.

    python scripts/bench_train.py --model hybrid_125m --precisions bf16 fp8_tensorwise nvfp4 --batch 8 --seq 2048

Times forward + backward + AdamW on random tokens (no data loading, no checkpoints) after warm-up steps,
and prints one row per policy: step time, tokens/s, model TFLOP/s, MFU against the detected GPU's
BF16 dense peak (emulated formats run BF16 GEMMs), and peak memory.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from nvfp4train.model import HybridLM, ModelConfig, flops_per_token, param_groups
from nvfp4train.model.mfu import peak_flops
from nvfp4train.optim import OptimConfig, build_optimizer
from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
from nvfp4train.train.config import load_preset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def bench_one(model_cfg: ModelConfig, precision: str, batch: int, seq: int, steps: int, warmup: int,
              device: torch.device) -> dict:
    policy = PrecisionPolicy.from_dict(load_preset("precision", precision))
    torch.manual_seed(0)
    model = HybridLM(model_cfg, linear_factory=build_linear_factory(policy, n_blocks=len(model_cfg.pattern), seed=0))
    model = model.to(device)
    controller = PrecisionController(policy, model)
    opt = build_optimizer(param_groups(model, 0.1), OptimConfig())
    tokens = torch.randint(0, model_cfg.vocab_size, (batch, seq + 1), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tok_s = batch * seq / step_s
    flops = flops_per_token(model_cfg, seq)["total"] * tok_s
    peak = peak_flops(device, "bf16") if device.type == "cuda" else None
    return {"precision": precision, "backend": controller.backend_name, "step_ms": step_s * 1e3,
            "tokens_per_s": tok_s, "tflops": flops / 1e12, "mfu_%": 100 * flops / peak[0] if peak else float("nan"),
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
            "loss": loss.item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hybrid_tiny")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp8_tensorwise", "fp8_blockwise", "nvfp4", "mxfp4"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--set", nargs="*", default=[], help="model overrides, e.g. ssd_backend=torch")
    args = ap.parse_args()
    raw = OmegaConf.merge(OmegaConf.load(CONFIGS / "model" / f"{args.model}.yaml"), OmegaConf.from_dotlist(args.set))
    model_cfg = ModelConfig.from_dict(OmegaConf.to_container(raw))
    device = torch.device(args.device)
    rows = [bench_one(model_cfg, p, args.batch, args.seq, args.steps, args.warmup, device) for p in args.precisions]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model {args.model}, batch {args.batch} x seq {args.seq}, device {name}, median of {args.steps} steps")
    cols = ["precision", "backend", "step_ms", "tokens_per_s", "tflops", "mfu_%", "peak_mem_gb", "loss"]
    print(" | ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]:>14.2f}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols))


if __name__ == "__main__":
    main()
