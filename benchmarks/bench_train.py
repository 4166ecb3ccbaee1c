"""Training throughput per model x sequence length x precision, through the trainer's own step.

    python -m benchmarks.bench_train --models hybrid_350m hybrid_1b --seqs 2048 4096 --batch 8
    python -m benchmarks.bench_train --device cpu --models hybrid_tiny --seqs 64 --batch 2 --steps 2   # smoke test

Each row builds the model and precision policy as the trainer does and times `engines.TorchEngine.train_step`
(fused chunked cross-entropy, device-side skip of non-finite steps, AdamW, the trainer's train.compile
setting: `--compile auto` compiles on CUDA) on random tokens, after warm-up steps (compilation and
Triton autotuning happen there). It reports step time, tokens/s, MFU against the GPU's dense BF16 peak
(named in the output; emulated and FP8/FP4 GEMMs alike, so rows compare) and peak memory, and merges one
row per model x seq x precision x backend into --out (a re-run replaces its row):
    {model, seq, batch, precision, backend, step_ms, tokens_per_s, mfu, peak_gib, gpu, commit}
and ends with every row against the BF16 row measured in the same invocation (tokens/s and step-time ratios).
`--torchao` adds a torchao float8 (tensorwise) row on plain BF16 linears when torchao imports: torchao
converts every block's linears (`torchao_float8`); `--torchao all fp8_tensorwise` adds a second row that
converts only the blocks our fp8_tensorwise preset quantizes (`torchao_float8_as_fp8_tensorwise`: its
first and last blocks stay BF16), the like-for-like comparison.
`--precision-set key=value ...` overrides precision keys of every quantized preset, in rows named with them:
`--precisions fp8_tensorwise --precision-set bf16_first=0 bf16_last=0` gives `fp8_tensorwise[bf16_first=0,
bf16_last=0]`, the preset with every block quantized (the LM head stays BF16 in every preset).
`--sync-debug` counts host synchronisations per step (torch.cuda.set_sync_debug_mode("warn") warnings
during the measured steps; CUDA only) and adds `syncs_per_step` to each row.
`--backends te scaled_mm emulated` runs each quantized precision on each backend (one that cannot run here
is skipped with its reason). `--profile DIR` profiles one more step per row after its timed window and
prints GPU kernel time by kind of kernel (GEMM, our quantizers, Mamba scan, copies, ...) and the top kernels,
each under the ops that launched it (op, input shapes, enclosing ops such as our custom ops; with
`--cuda-graph false`, since a replayed graph hides them), with a chrome trace and the list of every kernel
(`..._kernels.txt`) per row in DIR:
    python -m benchmarks.bench_train --models hybrid_350m --seqs 2048 --batch 8 --precisions bf16 nvfp4 \
        --profile /tmp/prof
The host's time per step: with `--cuda-graph false` and a sequence so short that the GPU's work is a small
part (`--seqs 128 --batch 1`), a step takes what the host needs to issue it, the same number of ops and
launches as a full step. Where that comes near the full step's GPU time, steps without a CUDA graph (DDP,
FSDP2) are paced by the host. `--host-profile N` runs one more step under cProfile and prints the N Python
functions with the most host time, and this package's N with the most time including what they call:
    python -m benchmarks.bench_train --models hybrid_1b --seqs 128 --batch 1 --precisions bf16 nvfp4 \
        --cuda-graph true false --host-profile 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time
import warnings
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nvfp4train.config import load_preset
from nvfp4train.config.schema import ConfigError
from nvfp4train.data.paths import git_commit
from nvfp4train.model import HybridLM, ModelConfig, flops_per_token, param_groups
from nvfp4train.model.mfu import peak_flops
from nvfp4train.optim import OptimConfig
from nvfp4train.parallel import DistInfo
from nvfp4train.precision import PrecisionController, PrecisionPolicy, QuantLinear, build_linear_factory
from nvfp4train.train.build import persistent_kernel_caches
from nvfp4train.train.engines import TorchEngine
from nvfp4train.train.plan import RunFacts, decide_compile, decide_cuda_graph
from nvfp4train.train.profiling import kernel_rows, summary_lines

REPO = Path(__file__).resolve().parents[1]
KEY = ("model", "seq", "precision", "backend", "compiled", "cuda_graph", "gpu")  # one row per key in the JSON file


def _key(row: dict) -> tuple:
    return tuple(row.get(k, False if k == "cuda_graph" else None) for k in KEY)  # older rows: eager steps


TORCHAO = "torchao_float8"  # the row of torchao's float8 training; "_as_<preset>": only that preset's quantized blocks


def _model(
    model_cfg: ModelConfig,
    precision: str,
    device: torch.device,
    backend: str = "auto",
    precision_set: dict | None = None,
):
    torch.manual_seed(0)
    if precision.startswith(TORCHAO):  # plain nn.Linear, converted by torchao
        from torchao.float8 import convert_to_float8_training

        model = HybridLM(model_cfg).to(device)
        convert_to_float8_training(
            model.blocks, module_filter_fn=torchao_block_filter(precision, len(model_cfg.pattern))
        )
        return model, "torchao"
    policy = PrecisionPolicy.from_dict(
        {**load_preset("precision", precision), **(precision_set or {}), "backend": backend}
    )
    model = HybridLM(model_cfg, layer_factory=build_linear_factory(policy, n_blocks=len(model_cfg.pattern), seed=0))
    model = model.to(device)
    return model, PrecisionController(policy, model).backend_name


def torchao_block_filter(precision: str, n_blocks: int):
    """torchao's module_filter_fn (module, fqn under model.blocks, e.g. "3.mixer.in_proj") for a torchao row:
    every linear, or with "_as_<preset>" only those of the blocks that precision preset quantizes."""
    if precision == TORCHAO:
        return None
    policy = PrecisionPolicy.from_dict(load_preset("precision", precision.removeprefix(TORCHAO + "_as_")))
    return lambda module, fqn: not policy.is_bf16_block(int(fqn.split(".")[0]), n_blocks)


def against_bf16(rows: list[dict]) -> list[str]:
    """Each row against the BF16 row of its model, shape and CUDA-graph setting measured in the same invocation
    (the same machine, minutes apart): tokens/s ratio (> 1: faster) and step-time ratio."""
    base = {(r["model"], r["seq"], r["batch"], r["cuda_graph"]): r for r in rows if r["precision"] == "bf16"}
    lines = []
    for r in rows:
        b = base.get((r["model"], r["seq"], r["batch"], r["cuda_graph"]))
        if b is None or r is b:
            continue
        lines.append(
            f"{r['model']:>12} seq {r['seq']:>5} x {r['batch']:<3} {r['precision']:>15} {r['backend']:>9}"
            f"{' graph' if r['cuda_graph'] else '':6}  {b['step_ms'] / r['step_ms']:6.3f}x tokens/s"
            f"  {r['step_ms'] / b['step_ms']:6.3f}x step"
        )
    return ["against bf16 in this run:", *lines] if lines else []


def profile_step(engine, micro_batch, step: int, device: torch.device, trace: Path | None) -> list[dict]:
    """One more training step under torch.profiler: per kernel (CUDA) or per op (CPU), its self time on
    the device, summed over calls; the chrome trace goes to `trace` when given."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        stats = engine.train_step(micro_batch, lr=1e-4, step=step)
        stats.loss.item()
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    return kernel_rows(prof, cuda, launch_sites(prof.events()) if cuda else {})


def launch_sites(events, depth: int = 4) -> dict[str, list[tuple[float, str]]]:
    """Kernel name -> [(ms, launching op chain)], most time first: the op that launched the kernel with
    its input shapes, then its enclosing ops (e.g. a custom op), so a copy or cast kernel can be traced
    to the code that asked for it. Kernels replayed from a CUDA graph show the graph launch only."""
    sites: dict[str, dict[str, float]] = {}
    for evt in events:
        if not evt.kernels:
            continue
        chain, parent = [f"{evt.name} {list(evt.input_shapes) if evt.input_shapes else ''}".rstrip()], evt.cpu_parent
        while parent is not None and len(chain) < depth:
            chain.append(parent.name)
            parent = parent.cpu_parent
        key = " < ".join(chain)
        for kernel in evt.kernels:
            per_chain = sites.setdefault(kernel.name, {})
            per_chain[key] = per_chain.get(key, 0.0) + kernel.duration / 1e3
    return {name: sorted(((ms, chain) for chain, ms in chains.items()), reverse=True) for name, chains in sites.items()}


def host_profile_step(engine, micro_batch, step: int, device: torch.device, top: int) -> list[str]:
    """One more training step under cProfile, the host's side only: the Python functions that took the most
    time themselves and, of this package's, the most time with what they call. A step whose host time is
    near its GPU time is paced by the host when nothing hides it (no CUDA graph: DDP, FSDP2)."""
    import cProfile
    import pstats

    if device.type == "cuda":
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    stats = engine.train_step(micro_batch, lr=1e-4, step=step)
    prof.disable()
    host_s = time.perf_counter() - t0
    stats.loss.item()
    table = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own s, with callees s, callers)

    def where(key) -> str:
        file, line, name = key
        return f"{name} ({Path(file).name}:{line})" if line else name

    own = sorted(table.items(), key=lambda kv: -kv[1][2])[:top]
    ours = sorted(((k, v) for k, v in table.items() if "nvfp4train" in k[0]), key=lambda kv: -kv[1][3])[:top]
    lines = [f"    host, one step under cProfile: {host_s * 1e3:.1f} ms until the step returned (profiler included)"]
    lines.append("    own time (calls, ms):")
    lines += [f"      {v[2] * 1e3:8.1f} ms {v[0]:>7}  {where(k)}" for k, v in own]
    lines.append("    this package's functions, with what they call (calls, ms):")
    lines += [f"      {v[3] * 1e3:8.1f} ms {v[0]:>7}  {where(k)}" for k, v in ours]
    return lines


def print_profile(rows: list[dict], top: int = 15, sources: int = 2) -> None:
    """The breakdown by kind and the top kernels, each with its `sources` costliest launch sites."""
    print("\n".join(summary_lines(rows, top, sources)))


def bench_one(
    model_name: str,
    model_cfg: ModelConfig,
    precision: str,
    batch: int,
    seq: int,
    steps: int,
    warmup: int,
    device: torch.device,
    compile: str,
    sync_debug: bool,
    backend: str = "auto",
    profile: Path | None = None,
    cuda_graph: str = "false",
    host_profile: int = 0,
    precision_set: dict | None = None,
) -> dict:
    model, backend = _model(model_cfg, precision, device, backend, precision_set)
    if precision_set:  # its own row: e.g. fp8_tensorwise[bf16_first=0,bf16_last=0] beside fp8_tensorwise
        precision += "[" + ",".join(f"{k}={v}" for k, v in precision_set.items()) + "]"
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=device)
    facts = RunFacts(
        n_params=sum(p.numel() for p in model.parameters()),
        mamba_blocks=model_cfg.count("M"),
        quantized=any(isinstance(m, QuantLinear) and m.quantized for m in model.modules()),
        te_layers=backend == "te",
        precision_backend=backend,
        precision_backend_reason="",
    )
    graphed = decide_cuda_graph(cuda_graph, facts, device, 1, "ddp")[0]
    compiled = decide_compile(compile, device.type, facts.mamba_blocks)[0]
    engine = TorchEngine(
        model,
        lambda m: param_groups(m, 0.1),
        OptimConfig(),
        "ddp",
        info,
        compile=compiled,
        cuda_graph=graphed,
    )
    if graphed:  # the capture happens in the warm-up, never in the timed window
        warmup = max(warmup, engine.step_graph.warmup_steps + 1)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model_cfg.vocab_size, (warmup + steps + 1, batch, seq + 1), generator=g)
    micro_batches = [[(t[:, :-1], t[:, 1:])] for t in tokens]
    cuda = device.type == "cuda"
    for i in range(warmup):
        if cuda and graphed and i == engine.step_graph.warmup_steps:
            # the graph's memory pool is allocated in its capture: the peak counts from there
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        engine.train_step(micro_batches[i], lr=1e-4, step=i + 1)
    if cuda:
        torch.cuda.synchronize()
        if not graphed:
            torch.cuda.reset_peak_memory_stats()
    syncs = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sync_debug and cuda:
            torch.cuda.set_sync_debug_mode("warn")
        t0 = time.perf_counter()
        for i in range(warmup, warmup + steps):  # as the trainer runs: no host read inside the window
            stats = engine.train_step(micro_batches[i], lr=1e-4, step=i + 1)
        if sync_debug and cuda:
            torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught) / steps
    loss = stats.loss.item()  # waits for the device: the window ends here
    step_s = (time.perf_counter() - t0) / steps
    tokens_per_s = batch * seq / step_s
    peak = peak_flops(device, "bf16") if cuda else None
    row = {
        "model": model_name,
        "seq": seq,
        "batch": batch,
        "precision": precision,
        "backend": backend,
        "compiled": compiled,
        "cuda_graph": graphed,
        "step_ms": round(step_s * 1e3, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(flops_per_token(model_cfg, seq)["total"] * tokens_per_s / peak[0], 4) if peak else None,
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if cuda else None,
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "commit": git_commit(short=True),
    }
    if sync_debug:
        row["syncs_per_step"] = syncs
    profiled = None
    if profile is not None:  # after the timed window, so it never slows the row's numbers
        name = re.sub(r"[^A-Za-z0-9.-]+", "_", f"{model_name}_seq{seq}_{precision}_{backend}")  # no [ = , in names
        trace = profile / f"{name}.json"
        profiled = profile_step(engine, micro_batches[-1], warmup + steps + 1, device, trace)
        listing = summary_lines(profiled, top=len(profiled), sources=3)
        trace.with_name(trace.stem + "_kernels.txt").write_text("\n".join(listing) + "\n")
    print(
        f"{model_name:>12} seq {seq:>5} x {batch:<3} {precision:>15} {backend:>9}{' graph' if graphed else ''}: "
        f"{row['step_ms']:>10.1f} ms "
        f"{row['tokens_per_s']:>10.0f} tok/s  MFU {100 * row['mfu'] if peak else float('nan'):5.1f}%  "
        f"peak {row['peak_gib'] or float('nan'):6.2f} GiB  loss {loss:.3f}"
        + (f"  host syncs/step {syncs}" if sync_debug else ""),
        flush=True,
    )
    if profiled is not None:
        print_profile(profiled)
    if host_profile:
        print("\n".join(host_profile_step(engine, micro_batches[-1], warmup + steps + 2, device, host_profile)))
    del engine, model
    if cuda:
        torch.cuda.empty_cache()
    return row


def merge_rows(path: Path, rows: list[dict]) -> list[dict]:
    """The rows of `path` with `rows` merged in: a row with the same model, seq, precision, backend, compile
    setting and GPU model is replaced (an H200's row never replaces an H100's). Written back sorted by that key."""
    existing = json.loads(path.read_text()) if path.is_file() else []
    merged = {_key(r): r for r in existing}
    merged.update({_key(r): r for r in rows})
    out = sorted(merged.values(), key=lambda r: tuple(str(v).zfill(8) for v in _key(r)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", "--model", nargs="+", default=["hybrid_350m", "hybrid_1b"])
    ap.add_argument("--seqs", "--seq", nargs="+", type=int, default=[2048, 4096])
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp8_tensorwise", "fp8_blockwise", "nvfp4", "mxfp4"])
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (one micro-batch)")
    ap.add_argument("--steps", type=int, default=10, help="measured steps")
    ap.add_argument("--warmup", type=int, default=3, help="steps before measuring (compilation, autotuning)")
    ap.add_argument("--compile", choices=["auto", "true", "false"], default="auto", help="as train.compile")
    ap.add_argument(
        "--cuda-graph",
        nargs="+",
        choices=["auto", "true", "false"],
        default=["auto"],
        help="as train.cuda_graph; several values give a row for each (e.g. false true: eager beside "
        "graphed steps in one run)",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--torchao",
        nargs="*",
        choices=["all", "fp8_tensorwise"],
        default=None,
        help="add torchao float8 rows (if torchao imports): every block's linears (all, the default) "
        "and/or only the blocks the fp8_tensorwise preset quantizes",
    )
    ap.add_argument("--sync-debug", action="store_true", help="count host syncs per step (CUDA)")
    ap.add_argument("--set", nargs="*", default=[], help="model overrides key=value, e.g. ssd_backend=torch")
    ap.add_argument(
        "--precision-set",
        nargs="*",
        default=[],
        help="precision overrides key=value for every quantized precision, e.g. bf16_first=0 bf16_last=0 (FP8 in "
        "every block); their rows are named with them, e.g. fp8_tensorwise[bf16_first=0,bf16_last=0]",
    )
    ap.add_argument(
        "--backends",
        nargs="+",
        default=["auto"],
        help="precision.backend for each quantized precision (auto | emulated | scaled_mm | te); a "
        "backend that cannot run a precision here is skipped with its reason; bf16 runs once",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="after each row's timed steps, profile one more step: print GPU kernel time by kind of "
        "kernel (GEMM, our quantizers, scan, copies, ...) and the top kernels; chrome traces "
        "into DIR",
    )
    ap.add_argument(
        "--host-profile",
        type=int,
        default=0,
        metavar="N",
        help="after each row's timed steps, run one more step under cProfile and print the N Python functions "
        "with the most host time (where a step without CUDA graph spends its host time)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/bench/train.json")
    args = ap.parse_args()

    precisions = list(args.precisions)
    if args.torchao is not None:
        try:
            import torchao.float8  # noqa: F401

            precisions += [TORCHAO if which == "all" else f"{TORCHAO}_as_{which}" for which in args.torchao or ["all"]]
        except ImportError as e:
            print(f"torchao float8 rows skipped: {e}")
    overrides = OmegaConf.to_container(OmegaConf.from_dotlist(args.set))
    precision_set = OmegaConf.to_container(OmegaConf.from_dotlist(args.precision_set))
    for precision in precisions:  # a bad override stops the run before any row, not as a skipped row
        if precision_set and precision != "bf16" and not precision.startswith(TORCHAO):
            try:
                PrecisionPolicy.from_dict({**load_preset("precision", precision), **precision_set})
            except ConfigError as e:
                raise SystemExit(f"--precision-set with {precision}: {e}") from None
    device = torch.device(args.device)
    if device.type == "cuda":
        persistent_kernel_caches()  # as the trainer: autotuning results of earlier runs are reused
    peak = peak_flops(device, "bf16") if device.type == "cuda" else None
    print(
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; MFU against "
        f"{peak[1] if peak else 'nothing (no known GPU)'}; compile={args.compile}; mean of {args.steps} steps"
    )
    rows = []
    for model_name in args.models:
        preset = load_preset("model", model_name)
        model_cfg = ModelConfig.from_dict({**preset, **overrides})
        for seq in args.seqs:
            for precision in precisions:
                plain = precision == "bf16" or precision.startswith(TORCHAO)
                for backend, graph in itertools.product(args.backends[:1] if plain else args.backends, args.cuda_graph):
                    try:
                        rows.append(
                            bench_one(
                                model_name,
                                model_cfg,
                                precision,
                                args.batch,
                                seq,
                                args.steps,
                                args.warmup,
                                device,
                                args.compile,
                                args.sync_debug,
                                backend,
                                args.profile,
                                graph,
                                args.host_profile,
                                None if plain else precision_set,
                            )
                        )
                    except torch.cuda.OutOfMemoryError:
                        print(f"{model_name} seq {seq} x {args.batch} {precision}: out of memory (row not written)")
                        torch.cuda.empty_cache()
                        continue
                    except ConfigError as e:  # an explicit backend this machine cannot run
                        print(f"{model_name} seq {seq} {precision} backend={backend}: skipped ({e})")
                        continue
                    merge_rows(args.out, rows[-1:])  # after each row: a later failure keeps the rows measured
    print("\n".join(against_bf16(rows)))
    print(f"{len(rows)} rows merged into {args.out}")


if __name__ == "__main__":
    main()
