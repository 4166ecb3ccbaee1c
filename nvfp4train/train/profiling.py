"""`train.profile_start=N`: torch.profiler over optimizer steps N .. N + train.profile_steps - 1, as Megatron's
`--profile-step-start/--profile-step-end` and torchtitan's profiling section.

Every rank writes `out_dir/profile/trace_rank<r>.json` (open it in https://ui.perfetto.dev or
chrome://tracing) and its summary, `summary.txt` (rank 0) or `summary_rank<r>.txt`: the window's elapsed time
per step beside its GPU kernels' time per step (kernel time far below the elapsed time means the GPU waits on the
CPU side: launches, Python, synchronisation, or on communication); on a GPU the GPU's timeline (how long some
kernel runs, how long only communication runs, how long nothing runs), the host's waits on the GPU, its time
inside torch ops and how soon kernels start after their launch; then the kernel time by kind and the top
kernels. The window starts and ends with a synchronisation, so its elapsed time is the steps' own. Comparing
ranks' timelines tells a rank that waits for another (its communication kernels run alone) from one that keeps
the others waiting (its GPU idles while its host works).

The kinds of kernel (KERNEL_KINDS) are also what benchmarks/bench_train.py --profile reports.
"""

from __future__ import annotations

import bisect
import time
from pathlib import Path

import torch

from nvfp4train.train.rundir import check_own, write_atomic

# What GPU kernel time is spent on, by kernel name (first match wins; lower-case substrings). Triton quantizer
# kernels are ours (formats/kernels/: _nvfp4_*, _mxfp4_*, _rht_*, _fp8_*, _abs_max_*); the Mamba scan's are
# mamba-ssm's SSD kernels; GEMMs are cuBLAS/CUTLASS (nvjet, sm90_xmma, cutlass, gemm) or torch._scaled_mm's.
KERNEL_KINDS = (
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "scaled_mm", "cublas", "addmm", "aten::mm", "aten::bmm")),
    ("quantize (ours)", ("nvfp4", "mxfp4", "_rht", "fp8", "abs_max", "e2m1", "quantiz")),
    ("mamba scan", ("chunk_scan", "chunk_state", "state_passing", "bmm_chunk", "chunk_cumsum", "ssd", "selective")),
    ("communication", ("nccl", "all_gather", "reduce_scatter", "allreduce", "all_reduce")),
    ("conv1d", ("conv", "causal_conv1d")),
    ("attention", ("flash", "attention", "fmha", "sdpa")),
    ("norm", ("rms_norm", "layer_norm", "rmsnorm")),
    ("copy / cast", ("copy", "cast", "to_copy", "cat", "convert")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
)


def kernel_kind(name: str) -> str:
    low = name.lower().replace("nvfp4train::", "")  # our custom ops' namespace is not a format
    for kind, needles in KERNEL_KINDS:
        if any(n in low for n in needles):
            return kind
    return "other"


def kernel_rows(prof, cuda: bool, sources: dict | None = None) -> list[dict]:
    """Per kernel (CUDA) or per op (CPU): self time on the device summed over the profiled calls, most first;
    `sources`: kernel name -> its launch sites, attached to each row."""
    from torch.autograd import DeviceType

    rows = []
    for evt in prof.key_averages():
        # A record_function range (e.g. "Optimizer.step#AdamW.step") also shows up on the GPU timeline,
        # spanning kernels that are counted on their own: they would be counted twice.
        if getattr(evt, "is_user_annotation", False):
            continue
        if cuda and evt.device_type != DeviceType.CUDA:
            continue
        if not cuda and (evt.device_type != DeviceType.CPU or evt.key.startswith("ProfilerStep")):
            continue
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        if us > 0:
            rows.append(
                {
                    "name": evt.key,
                    "calls": evt.count,
                    "ms": us / 1e3,
                    "kind": kernel_kind(evt.key),
                    "sources": (sources or {}).get(evt.key, []),
                }
            )
    return sorted(rows, key=lambda r: -r["ms"])


def summary_lines(rows: list[dict], top: int = 15, sources: int = 2, per: int = 1, what: str = "step") -> list[str]:
    """GPU kernel time by kind and the top kernels (each with its `sources` costliest launch sites), divided by
    `per` (the number of steps the rows cover)."""
    total = sum(r["ms"] for r in rows) / per or 1.0
    kinds: dict[str, float] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0.0) + r["ms"] / per
    lines = [f"    profiled {what}: {total:.1f} ms of kernel time"]
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        lines.append(f"      {kind:<16} {ms:9.2f} ms {100 * ms / total:5.1f}%")
    lines.append(f"    top {top} kernels:")
    for r in rows[:top]:
        ms = r["ms"] / per
        lines.append(f"      {ms:9.2f} ms {100 * ms / total:5.1f}% x{r['calls']:<5} {r['kind']:<16} {r['name'][:90]}")
        for site_ms, chain in r.get("sources", [])[:sources]:
            lines.append(f"          <- {site_ms / per:7.2f} ms  {chain[:160]}")
    return lines


def busy_us(intervals) -> float:
    """Length of the union of (start, end) intervals: the time in which at least one of them runs."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def gpu_timeline(activities: list[tuple[float, float, str]], wall_ms: float, steps: int) -> dict:
    """Per step, from the GPU activities (start µs, end µs, kernel name) of all streams in a window of `wall_ms`
    over `steps` steps: ms in which some kernel runs (`running`), of it ms in which a kernel other than
    communication runs (`compute`) and ms in which only communication kernels run (`communication_alone`: waiting
    for the collective's peers, or transfers not hidden behind compute), ms in which nothing runs (`idle`: the
    host has not launched the next kernel), and the number of activities."""
    compute = [(s, e) for s, e, name in activities if kernel_kind(name) != "communication"]
    running = busy_us((s, e) for s, e, _ in activities) / 1e3
    computing = busy_us(compute) / 1e3
    return {
        "running": running / steps,
        "compute": computing / steps,
        "communication_alone": (running - computing) / steps,
        "idle": max(0.0, wall_ms - running) / steps,
        "activities": len(activities) / steps,
    }


def launch_lag(launches: dict[int, float], starts: list[tuple[int, float]], near_us: float = 100.0) -> dict | None:
    """How far ahead of the device the host is: for each kernel (correlation id, start µs) whose launch call
    (correlation id -> start µs) is in `launches`, the time from its launch to its start. A kernel that starts
    within `near_us` of its launch found the device waiting for it; most kernels so means the host paces the
    step. None when no kernel could be matched to its launch (`kernels`: how many were; those of a CUDA graph
    have a graph launch instead, and are not among them)."""
    lags = sorted(start - launches[cid] for cid, start in starts if cid in launches)
    if not lags:
        return None
    near = sum(lag < near_us for lag in lags) / len(lags)
    return {"median_ms": lags[len(lags) // 2] / 1e3, "near": near, "kernels": len(lags)}


def custom_op_host(ops: list[tuple[str, float, float]], launches: list[float], steps: int, top: int = 6) -> list[str]:
    """Where the host's time in our custom ops goes, per step: each op's ms and calls (`ops`: name, start µs,
    end µs of the calls, nested calls of the same op counted once) and, of all of it, the kernel-launch API calls
    (`launches`: their start µs) that ran inside one of them: little launching in much op time is Python (ours,
    Triton's launcher, torch's op wrappers), not the driver."""
    if not ops:
        return []
    per_op: dict[str, list] = {}
    for name, start, end in ops:
        per_op.setdefault(name, []).append((start, end))
    spans = sorted((s, e) for _, s, e in ops)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    starts = [s for s, _ in merged]
    inside = sum(1 for t in launches if (i := bisect.bisect_right(starts, t) - 1) >= 0 and t <= merged[i][1])
    ranked = sorted(((busy_us(s), len(s), name) for name, s in per_op.items()), reverse=True)
    parts = [
        f"{name.removeprefix('nvfp4train::')} {us / 1e3 / steps:.1f} ms x{calls / steps:g}"
        for us, calls, name in ranked[:top]
    ]
    by_op = ", ".join(parts)
    return [f"    host per step in our custom ops, by op: {by_op}; {inside / steps:g} kernel launches inside them"]


# CUDA runtime calls in which the host waits for the device (a `.item()`, a copy to host memory, a synchronize).
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def timeline_lines(prof, wall_ms: float, steps: int) -> list[str]:
    """Per step of a CUDA profile: the GPU timeline (gpu_timeline), the host's waits on the GPU, the host's
    time inside torch ops (and inside ours), and the launch-to-start lag (launch_lag)."""
    from torch.autograd import DeviceType

    activities, waits, launches, starts, host_ops, our_ops, named_ops = [], {}, {}, [], [], [], []
    for evt in prof.events():
        if getattr(evt, "is_user_annotation", False):
            continue
        span = (evt.time_range.start, evt.time_range.end)
        if evt.device_type == DeviceType.CUDA:
            activities.append((*span, evt.name))
            starts.append((evt.id, span[0]))  # the id is the correlation id of its launch
            continue
        if evt.device_type != DeviceType.CPU:
            continue
        host_ops.append(span)
        if evt.name.startswith("nvfp4train::"):  # our custom ops: the quantized linears, norm, conv, SSD scan
            our_ops.append(span)
            named_ops.append((evt.name, *span))
        if "LaunchKernel" in evt.name:
            launches[evt.id] = span[0]
        elif evt.name.startswith(HOST_WAITS) and "Async" not in evt.name:
            calls, us = waits.get(evt.name, (0, 0.0))
            waits[evt.name] = (calls + 1, us + span[1] - span[0])
    t = gpu_timeline(activities, wall_ms, steps)
    copies_to_host = sum(1 for *_, name in activities if "DtoH" in name) / steps
    lines = [
        f"    GPU timeline per step: some kernel running {t['running']:.1f} ms (other than communication "
        f"{t['compute']:.1f}, communication alone {t['communication_alone']:.1f}), nothing running {t['idle']:.1f} ms; "
        f"{t['activities']:.0f} kernels and copies, {copies_to_host:g} to host memory",
    ]
    waited = ", ".join(
        f"{name} x{calls / steps:g} {us / 1e3 / steps:.2f} ms" for name, (calls, us) in sorted(waits.items())
    )
    lines.append(f"    host waits on the GPU per step: {waited or 'none'}")
    lines.append(
        f"    host per step: inside torch ops {busy_us(host_ops) / 1e3 / steps:.1f} ms (the waits included), of it"
        f" in our custom ops (nvfp4train::) {busy_us(our_ops) / 1e3 / steps:.1f} ms"
    )
    lines += custom_op_host(named_ops, list(launches.values()), steps)
    lag = launch_lag(launches, starts)
    if lag is not None:
        lines.append(
            f"    launch to start: median {lag['median_ms']:.2f} ms; {100 * lag['near']:.0f}% of the"
            f" {lag['kernels'] / steps:.0f} kernels a step launched one by one started within 0.1 ms of their"
            " launch (the GPU was waiting for the host)"
        )
    return lines


class StepProfiler:
    """The profiling window of a run: before_step / after_step around each optimizer step enqueued."""

    def __init__(self, start: int, steps: int, out_dir: Path, rank: int, device: torch.device, log=print):
        self.start, self.steps, self.end = start, steps, start + steps - 1
        self.dir, self.rank, self.device, self.log = Path(out_dir) / "profile", rank, device, log
        self.prof = None
        self.t0 = 0.0

    @property
    def enabled(self) -> bool:
        return self.start > 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def before_step(self, step: int) -> None:
        if not self.enabled or step != self.start:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._sync()
        self.prof = profile(activities=activities, record_shapes=True)
        self.prof.__enter__()
        self.t0 = time.perf_counter()

    def after_step(self, step: int) -> None:
        if self.prof is not None and step >= self.end:
            self.finish(step)

    def finish(self, last_step: int) -> None:
        """End the window at `last_step` (also when the run stops inside it) and write the files."""
        if self.prof is None:
            return
        self._sync()
        wall_ms = (time.perf_counter() - self.t0) * 1e3
        self.prof.__exit__(None, None, None)
        prof, self.prof = self.prof, None
        steps = last_step - self.start + 1
        self.dir.mkdir(parents=True, exist_ok=True)
        trace = self.dir / f"trace_rank{self.rank}.json"
        check_own(trace)  # torch writes it with open(): never through a link left in the run directory
        prof.export_chrome_trace(str(trace))
        rows = kernel_rows(prof, self.device.type == "cuda")
        kernel_ms = sum(r["ms"] for r in rows) / steps
        window = f"steps {self.start}-{last_step} ({steps} step{'s' if steps > 1 else ''})"
        head = [
            f"profile of {window}, rank {self.rank} of the run",
            f"    wall time per step: {wall_ms / steps:.1f} ms; "
            + (
                f"GPU kernel time per step (summed over streams): {kernel_ms:.1f} ms"
                if self.device.type == "cuda"
                else f"CPU time per step (ops' self time): {kernel_ms:.1f} ms"
            ),
        ]
        if self.device.type == "cuda":
            head += timeline_lines(prof, wall_ms, steps)
        text = "\n".join(head + summary_lines(rows, per=steps, what="steps, per step")) + "\n"
        summary = self.dir / ("summary.txt" if self.rank == 0 else f"summary_rank{self.rank}.txt")
        write_atomic(summary, text)
        if self.rank == 0:
            self.log(f"profile of steps {self.start}-{last_step}: {self.dir}/summary.txt, {trace.name}")
