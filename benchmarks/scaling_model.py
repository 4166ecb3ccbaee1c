"""Step time versus GPU count under FSDP2: a small model from measured throughput and bandwidths.

    python benchmarks/scaling_model.py                                  # hybrid_1b, nemotron_h_8b/12b
    python benchmarks/scaling_model.py --comm-json comm.json --gpus 1 2 8 16 64 --json scaling.json

Pure arithmetic (no torch, no GPU). Per optimizer step and GPU, with P parameters, m micro-batches of b
sequences of s tokens on each of N GPUs (G per node):

  compute    t_c = m*b*s / T1, T1 the measured one-GPU tokens/s (models not measured: T1 of the
             reference model scaled by its FLOPs per token, i.e. the same MFU: an assumption, labelled)
  all-gather FSDP2 gathers every block's BF16 weights at each micro-batch's forward, and again in its
             backward when resharding: A = m * (2 if reshard else 1) * 2P bytes of gathered weights
  reduce-scatter of the FP32 gradients, once a step (no_sync skips it on the other micro-batches): R = 4P
  wire time  t_w = (N-1)/N * (A + R) / B_bus, B_bus the collectives' bus bandwidth: measured inside a
             node (bench_comm.py), the per-GPU network bandwidth across nodes (an assumption, stated)
  step       t = max(t_c, t_w) + t_exposed, where t_exposed is what prefetching cannot hide: the root
             unit's gather before the first block (the embedding; FSDP2's root holds embedding, final norm
             and head) and its reduce-scatter after the last, (N-1)/N * (2 + 4) * P_root / B_bus
  overhead   the 1->2 GPU measurement calibrates a constant per-step overhead (launches, waits on the
             host, the optimizer on a shard): measured 2-GPU step minus the model's, added at every N > 1

HSDP (shard inside a node, replicate across nodes: train.parallel=hsdp) is reported beside FSDP2 for
multi-node counts: the gathers stay on NVLink, only the gradient all-reduce of each GPU's 1/G shard,
2 * (nodes-1)/nodes * 4P/G bytes, crosses the network.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

# Measured on 2x H100 80GB HBM3, hybrid_1b seq 4096, global batch 8, micro 4, compile + CUDA graph on one GPU
# (benchmarks/bench_distributed.py, tokens/s as the mean of the logged steps in the second half): one GPU, DDP
# and FSDP2 at its defaults (auto -> keep) on 2026-11-25 at commit e5a71be (docs/results/bench/distributed.json);
# FSDP2 resharding was not measured again: issue #37's midpoint of 97-108k.
REFERENCE = {
    "model": "hybrid_1b",
    "seq": 4096,
    "micro": 4,
    "global_batch": 8,
    "gpu": "H100 80GB HBM3",
    "one_gpu_tokens_per_s": 76.6e3,
    "two_gpu_tokens_per_s": {"ddp": 137.5e3, "fsdp2_reshard": 102.5e3, "fsdp2_keep": 148.6e3},
    "source": "docs/results/bench/distributed.json (2x H100, commit e5a71be); fsdp2_reshard: issue #37 (97-108k)",
}
# Parameters, blocks and training FLOPs per token at seq 4096 of the model presets (configs/model/*.yaml;
# printed by `python benchmarks/scaling_model.py --count` which builds each on the meta device).
MODELS = {
    "hybrid_1b": {"params": 984_039_680, "blocks": 26, "root_params": 206_047_232, "flops_per_token": 5.489491968e9},
    "nemotron_h_8b": {
        "params": 8_084_075_520,
        "blocks": 52,
        "root_params": 1_073_745_920,
        "flops_per_token": 46.087667712e9,
    },
    "nemotron_h_12b": {
        "params": 12_310_001_152,
        "blocks": 62,
        "root_params": 1_342_182_400,
        "flops_per_token": 71.171702784e9,
    },
}
# Assumptions (labelled in every output): the network across nodes, and NVLink's bus bandwidth for the
# collectives until bench_comm.py measures it on the node.
ASSUMED_INTER_NODE_GBPS = 400.0  # InfiniBand NDR, one 400 Gb/s NIC per GPU
ASSUMED_INTRA_NODE_BUS_GBYTES = 300.0  # H100 NVLink 4 all-gather / reduce-scatter bus bandwidth, GB/s
KEEP_GATHERED_MAX_SHARE = 1 / 8  # nvfp4train.parallel: auto keeps gathered weights below this share
GPU_MEMORY_BYTES = 80e9


@dataclass(frozen=True)
class Setup:
    model: str
    params: int
    blocks: int
    root_params: int  # FSDP2's root unit: embedding, final norm, LM head
    flops_per_token: float
    seq: int
    micro: int  # sequences per micro-batch on one GPU
    micro_batches: int  # per GPU per optimizer step (gradient accumulation)
    one_gpu_tokens_per_s: float
    throughput_source: str


@dataclass(frozen=True)
class Network:
    intra_bus_gbytes: float  # GB/s, collectives inside a node
    inter_bus_gbytes: float  # GB/s per GPU, collectives across nodes
    gpus_per_node: int
    intra_source: str
    inter_source: str


def reshard_auto(params: int, memory: float = GPU_MEMORY_BYTES) -> bool:
    """nvfp4train's train.fsdp_reshard_after_forward=auto: reshard unless the gathered BF16 weights fit in 1/8."""
    return 2 * params > KEEP_GATHERED_MAX_SHARE * memory


def bus_bandwidth(n_gpus: int, net: Network) -> float:
    """GB/s of a collective over n_gpus: NVLink inside one node, else the network (the ring's slowest link)."""
    return net.intra_bus_gbytes if n_gpus <= net.gpus_per_node else net.inter_bus_gbytes


def fsdp2_step(setup: Setup, n_gpus: int, net: Network, reshard: bool, overhead_s: float = 0.0) -> dict:
    """The FSDP2 step's parts in seconds and the resulting tokens/s (see the module docstring)."""
    p = setup.params
    tokens = setup.micro * setup.seq * setup.micro_batches
    t_c = tokens / setup.one_gpu_tokens_per_s
    if n_gpus == 1:
        return {
            "gpus": 1,
            "compute_s": t_c,
            "wire_s": 0.0,
            "exposed_s": 0.0,
            "overhead_s": 0.0,
            "step_s": t_c,
            "tokens_per_s": tokens / t_c,
            "per_gpu_efficiency": 1.0,
            "reshard": False,
        }
    frac = (n_gpus - 1) / n_gpus
    bw = bus_bandwidth(n_gpus, net) * 1e9
    gathered = setup.micro_batches * (2 if reshard else 1) * 2 * p
    reduced = 4 * p
    t_w = frac * (gathered + reduced) / bw
    t_exposed = frac * (2 + 4) * setup.root_params / bw
    step = max(t_c, t_w) + t_exposed + overhead_s
    return {
        "gpus": n_gpus,
        "compute_s": t_c,
        "wire_s": t_w,
        "exposed_s": t_exposed,
        "overhead_s": overhead_s,
        "step_s": step,
        "tokens_per_s": n_gpus * tokens / step,
        "per_gpu_efficiency": t_c / step,
        "reshard": reshard,
    }


def hsdp_step(setup: Setup, n_gpus: int, net: Network, reshard: bool, overhead_s: float = 0.0) -> dict:
    """Shard inside each node (FSDP2 over G GPUs on NVLink), replicate across nodes (an all-reduce of each
    GPU's gradient shard over the network, overlapped with backward but for the last block's)."""
    g = net.gpus_per_node
    if n_gpus <= g:
        return fsdp2_step(setup, n_gpus, net, reshard, overhead_s)
    nodes = n_gpus // g
    inner = fsdp2_step(setup, g, net, reshard, overhead_s)
    shard_bytes = 4 * setup.params / g
    t_ar = 2 * (nodes - 1) / nodes * shard_bytes / (net.inter_bus_gbytes * 1e9)
    exposed = t_ar * setup.root_params / setup.params  # the root's share, reduced last
    step = max(inner["compute_s"], inner["wire_s"] + t_ar) + inner["exposed_s"] + exposed + overhead_s
    tokens = setup.micro * setup.seq * setup.micro_batches
    return {
        **inner,
        "gpus": n_gpus,
        "wire_s": inner["wire_s"] + t_ar,
        "exposed_s": inner["exposed_s"] + exposed,
        "step_s": step,
        "tokens_per_s": n_gpus * tokens / step,
        "per_gpu_efficiency": inner["compute_s"] / step,
    }


def calibrate_overhead(ref: Setup, net: Network, measured_two_gpu_tokens_per_s: float, reshard: bool) -> float:
    """The per-step overhead that makes the model give the measured 2-GPU tokens/s (>= 0)."""
    model = fsdp2_step(ref, 2, net, reshard)
    measured_step = 2 * ref.micro * ref.seq * ref.micro_batches / measured_two_gpu_tokens_per_s
    return max(0.0, measured_step - model["step_s"])


def setup_for(model: str, seq: int = 4096, micro: int | None = None, micro_batches: int = 1) -> Setup:
    """The model's Setup: the reference's measured throughput, scaled by FLOPs per token for the others."""
    m = MODELS[model]
    ref = MODELS[REFERENCE["model"]]
    if model == REFERENCE["model"]:
        t1, source = REFERENCE["one_gpu_tokens_per_s"], f"measured ({REFERENCE['source']})"
    else:
        t1 = REFERENCE["one_gpu_tokens_per_s"] * ref["flops_per_token"] / m["flops_per_token"]
        source = (
            f"assumed: {REFERENCE['model']}'s measured MFU "
            f"(tokens/s x {ref['flops_per_token'] / m['flops_per_token']:.3f})"
        )
    if micro is None:
        micro = REFERENCE["micro"] if model == REFERENCE["model"] else 1
    return Setup(
        model, m["params"], m["blocks"], m["root_params"], m["flops_per_token"], seq, micro, micro_batches, t1, source
    )


def network_from(comm_json: Path | None, inter_gbps: float, gpus_per_node: int) -> Network:
    intra, source = ASSUMED_INTRA_NODE_BUS_GBYTES, "assumed (H100 NVLink; to be measured with bench_comm.py)"
    if comm_json is not None:
        rows = json.loads(Path(comm_json).read_text())["rows"]
        big = [r for r in rows if r["op"] in ("all_gather", "reduce_scatter")]
        largest = max(r["bytes"] for r in big)
        at_largest = [r["bus_gbytes"] for r in big if r["bytes"] == largest]
        intra = min(at_largest)
        source = f"measured: {comm_json} ({min(r['world_size'] for r in big)} GPUs, {largest / 1e6:.0f} MB, slower op)"
    return Network(intra, inter_gbps / 8, gpus_per_node, source, f"assumed: {inter_gbps:.0f} Gb/s per GPU")


def table(models: list[str], gpu_counts: list[int], net: Network, seq: int = 4096) -> list[dict]:
    ref = setup_for(REFERENCE["model"], seq, REFERENCE["micro"], 1)
    two_gpu = REFERENCE["two_gpu_tokens_per_s"]
    overhead = {
        r: calibrate_overhead(ref, net, two_gpu["fsdp2_reshard" if r else "fsdp2_keep"], r) for r in (True, False)
    }
    rows = []
    for name in models:
        setup = setup_for(name, seq)
        reshard = reshard_auto(setup.params)
        for n in gpu_counts:
            for layout, fn in (("fsdp2", fsdp2_step), ("hsdp", hsdp_step)):
                if layout == "hsdp" and n <= net.gpus_per_node:
                    continue
                parts = fn(setup, n, net, reshard, overhead[reshard] if n > 1 else 0.0)
                rows.append(
                    {
                        "model": name,
                        "layout": layout,
                        **parts,
                        "global_batch": n * setup.micro * setup.micro_batches,
                        "micro": setup.micro,
                        "nodes": math.ceil(n / net.gpus_per_node),
                        "speedup": parts["tokens_per_s"] / setup.one_gpu_tokens_per_s,
                        "throughput_source": setup.throughput_source,
                    }
                )
    return rows


def check_against_reference(net: Network) -> list[dict]:
    """The model's 2-GPU prediction without the calibrated overhead beside the measured 1->2 GPU numbers."""
    ref = setup_for(REFERENCE["model"], REFERENCE["seq"], REFERENCE["micro"], 1)
    out = []
    for label, reshard in (("fsdp2_reshard", True), ("fsdp2_keep", False)):
        predicted = fsdp2_step(ref, 2, net, reshard)
        measured = REFERENCE["two_gpu_tokens_per_s"][label]
        out.append(
            {
                "run": label,
                "predicted_tokens_per_s": predicted["tokens_per_s"],
                "predicted_speedup": predicted["tokens_per_s"] / ref.one_gpu_tokens_per_s,
                "measured_tokens_per_s": measured,
                "measured_speedup": measured / ref.one_gpu_tokens_per_s,
                "wire_s": predicted["wire_s"],
                "compute_s": predicted["compute_s"],
                "unexplained_s": calibrate_overhead(ref, net, measured, reshard),
            }
        )
    return out


def slurm_command(model: str, gpus: int, gpus_per_node: int, seq: int = 4096, layout: str = "fsdp2") -> str:
    """The sbatch line for `gpus` GPUs: nodes, one task (torchrun) per node, the global batch it implies,
    and the layout (train.parallel=fsdp2 or hsdp; hsdp's shard size defaults to the GPUs of a node)."""
    setup = setup_for(model, seq)
    nodes = math.ceil(gpus / gpus_per_node)
    per_node = min(gpus, gpus_per_node)
    batch = nodes * per_node * setup.micro * setup.micro_batches
    return (
        f"sbatch --nodes={nodes} --gpus-per-node={per_node} slurm/multi_node.sbatch model={model} "
        f"train.seq_len={seq} train.global_batch_size={batch} train.micro_batch_size={setup.micro} "
        f"train.parallel={layout}"
    )


def count_parameters() -> None:
    """Print MODELS' numbers from the presets (needs torch and the package)."""
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig, flops_per_token

    for name in MODELS:
        cfg = ModelConfig.from_dict(load_preset("model", name))
        with torch.device("meta"):
            model = HybridLM(cfg)
        n = sum(p.numel() for p in model.parameters())
        root = n - sum(p.numel() for b in model.blocks for p in b.parameters())
        print(
            f'"{name}": {{"params": {n}, "blocks": {len(cfg.pattern)}, "root_params": {root}, '
            f'"flops_per_token": {flops_per_token(cfg, 4096)["total"]:.9e}}}'
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument(
        "--inter-node-gbps",
        type=float,
        default=ASSUMED_INTER_NODE_GBPS,
        help="network bandwidth per GPU across nodes, Gb/s (an assumption; default 400: one NDR NIC a GPU)",
    )
    ap.add_argument("--comm-json", type=Path, default=None, help="bench_comm.py's JSON: the measured NVLink bandwidth")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--count", action="store_true", help="print the presets' parameter counts and exit")
    args = ap.parse_args(argv)
    if args.count:
        count_parameters()
        return
    net = network_from(args.comm_json, args.inter_node_gbps, args.gpus_per_node)
    print(f"inside a node: {net.intra_bus_gbytes:.0f} GB/s bus bandwidth ({net.intra_source})")
    print(f"across nodes: {net.inter_bus_gbytes:.0f} GB/s per GPU ({net.inter_source})")
    print("\ncheck against the 1->2 GPU measurement (hybrid_1b, seq 4096, micro 4):")
    check = check_against_reference(net)
    for c in check:
        print(
            f"  {c['run']:<14} predicted {c['predicted_tokens_per_s'] / 1e3:6.1f}k ({c['predicted_speedup']:.2f}x)  "
            f"measured {c['measured_tokens_per_s'] / 1e3:6.1f}k ({c['measured_speedup']:.2f}x)  "
            f"compute {c['compute_s'] * 1e3:.0f} ms, wire {c['wire_s'] * 1e3:.1f} ms, unexplained "
            f"{c['unexplained_s'] * 1e3:.0f} ms/step (added as overhead below)"
        )
    rows = table(args.models, args.gpus, net)
    print(
        f"\n{'model':<15} {'layout':<6} {'GPUs':>5} {'nodes':>5} {'batch':>6} {'reshard':>7} {'compute':>8} "
        f"{'wire':>8} {'step':>8} {'tok/s':>10} {'speedup':>8} {'eff':>5}"
    )
    for r in rows:
        print(
            f"{r['model']:<15} {r['layout']:<6} {r['gpus']:>5} {r['nodes']:>5} {r['global_batch']:>6} "
            f"{str(r['reshard']).lower():>7} {r['compute_s'] * 1e3:>6.0f}ms {r['wire_s'] * 1e3:>6.0f}ms "
            f"{r['step_s'] * 1e3:>6.0f}ms {r['tokens_per_s']:>10.0f} {r['speedup']:>7.1f}x "
            f"{r['per_gpu_efficiency']:>5.0%}"
        )
    print("\nthroughput sources: " + "; ".join(sorted({f"{r['model']}: {r['throughput_source']}" for r in rows})))
    print("\nSLURM (one torchrun per node, weak scaling: micro-batch fixed, global batch grows with the GPUs):")
    for name in args.models:
        for n in [g for g in args.gpus if g > args.gpus_per_node][:2]:
            fastest = max((r for r in rows if r["model"] == name and r["gpus"] == n), key=lambda r: r["tokens_per_s"])
            print("  " + slurm_command(name, n, args.gpus_per_node, layout=fastest["layout"]))
    if args.json:
        args.json.write_text(
            json.dumps({"network": asdict(net), "reference": REFERENCE, "check": check, "rows": rows}, indent=1) + "\n"
        )
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
