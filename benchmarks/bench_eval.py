"""Wall time of one in-training held-out evaluation (`train/heldout.py`'s `evaluate_as`, which the trainer runs
every train.eval_every steps and records as `eval_time_s`), per precision.

    python -m benchmarks.bench_eval                       # CUDA: hybrid_5m, 2 sources x 64 sequences of 1024
    python -m benchmarks.bench_eval --device cpu --model hybrid_tiny --seq 64 --sequences 4 --repeats 1 \
        --out /tmp/eval.json                              # a smoke run

The model is built as the trainer builds it (the precision preset's linears, a `PrecisionController`) with its
initial weights; the held-out sequences are random token ids, put on the device before timing, as the trainer
keeps them. The first evaluation (kernel compilation, autotuning) is not timed; `eval_s` is the median of
--repeats evaluations, each ending when the host has read its losses (as `eval_time_s`), and `tokens_per_s`
the held-out tokens scored per second (both passes' with eval_precision=both). Rows are printed as a table and
merged into --out (default docs/results/bench/eval.json), one per (model, precision, eval_precision, seq,
sequences, sources, micro_batch, gpu): {model, precision, eval_precision, seq, sequences, sources, micro_batch,
backend, eval_s, tokens_per_s, gpu, commit}; a re-run replaces its rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from nvfp4train.config import CONFIG_DIR, load_preset
from nvfp4train.data.paths import git_commit
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
from nvfp4train.train.heldout import evaluate_as, runs_in_bf16

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results" / "bench" / "eval.json"
KEY = ("model", "precision", "eval_precision", "seq", "sequences", "sources", "micro_batch", "gpu")
PRECISIONS = ("bf16", "fp8_tensorwise", "fp8_blockwise", "nvfp4")


def presets(kind: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def build(model_name: str, precision: str, device: torch.device):
    """(model, controller) as train/build.py makes them, on `device`."""
    model_cfg = ModelConfig.from_dict(load_preset("model", model_name))
    policy = PrecisionPolicy.from_dict(load_preset("precision", precision))
    torch.manual_seed(0)
    model = HybridLM(model_cfg, layer_factory=build_linear_factory(policy, len(model_cfg.pattern), seed=0))
    model = model.to(device)
    return model, PrecisionController(policy, model)


def time_evaluation(model, controller, val_data: dict, eval_precision: str, micro_batch: int, repeats: int, device):
    """Seconds of each of `repeats` evaluations, after an untimed first one."""

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        evaluate_as(eval_precision, model, val_data, micro_batch, device, controller.layers)  # reads the losses
        return time.perf_counter() - start

    once()
    return [once() for _ in range(repeats)]


def merge(path: Path, rows: list[dict]) -> None:
    """Replace the rows with the same key (KEY), keep the others: each GPU model keeps its own."""
    old = json.loads(path.read_text()) if path.exists() else []
    key = lambda r: tuple(str(r.get(k)) for k in KEY)  # noqa: E731
    new_keys = {key(r) for r in rows}
    merged = [r for r in old if key(r) not in new_keys] + rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sorted(merged, key=key), indent=1) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="hybrid_5m", choices=presets("model"), metavar="MODEL")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=presets("precision"))
    ap.add_argument("--eval-precision", nargs="+", default=["train"], choices=["train", "bf16", "both"])
    ap.add_argument("--seq", type=int, default=1024, help="sequence length (train.seq_len)")
    ap.add_argument("--sequences", type=int, default=64, help="held-out sequences per source (train.eval_sequences)")
    ap.add_argument("--sources", type=int, default=2, help="held-out sources")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per forward (train.micro_batch_size)")
    ap.add_argument("--repeats", type=int, default=3, help="timed evaluations (after an untimed one)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    for name in ("seq", "sequences", "sources", "micro_batch", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    commit = git_commit(short=True)
    vocab = ModelConfig.from_dict(load_preset("model", args.model)).vocab_size
    g = torch.Generator().manual_seed(0)
    val_data = {
        f"source{i}": torch.randint(0, vocab, (args.sequences, args.seq + 1), generator=g).to(device)
        for i in range(args.sources)
    }
    tokens = args.sources * args.sequences * args.seq
    rows = []
    print(f"{'precision':16s} {'eval_precision':14s} {'backend':9s} {'eval_s':>9s} {'tokens/s':>12s}", flush=True)
    for precision in args.precisions:
        model, controller = build(args.model, precision, device)
        for eval_precision in args.eval_precision:
            seconds = time_evaluation(
                model, controller, val_data, eval_precision, args.micro_batch, args.repeats, device
            )
            eval_s = statistics.median(seconds)
            passes = 2 if eval_precision == "both" and not runs_in_bf16(controller.layers) else 1
            row = {
                "model": args.model,
                "precision": precision,
                "eval_precision": eval_precision,
                "seq": args.seq,
                "sequences": args.sequences,
                "sources": args.sources,
                "micro_batch": args.micro_batch,
                "backend": controller.backend_name,
                "eval_s": round(eval_s, 4),
                "tokens_per_s": round(passes * tokens / eval_s, 1),
                "gpu": gpu,
                "commit": commit,
            }
            rows.append(row)
            print(
                f"{precision:16s} {eval_precision:14s} {row['backend']:9s} {eval_s:9.4f} {row['tokens_per_s']:12,.0f}",
                flush=True,
            )
        del model, controller
    merge(args.out, rows)
    print(f"{len(rows)} row(s) merged into {args.out}")
    return rows


if __name__ == "__main__":
    main()
