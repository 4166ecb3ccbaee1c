"""benchmarks/bench_train.py on CPU with the tiny model: it runs the trainer's step and merges its rows into
the JSON file (a re-run replaces the row of the same model x seq x precision x backend x compile and
CUDA-graph setting, others stay; older rows without
`cuda_graph` count as eager steps)."""

import json

import torch

from tests.bench import run_benchmark


def test_bench_train_smoke_and_json_merge(tmp_path):
    out = tmp_path / "train.json"
    keep = {
        "model": "hybrid_1b",
        "seq": 4096,
        "batch": 8,
        "precision": "nvfp4",
        "backend": "emulated",
        "compiled": False,
        "step_ms": 1.0,
        "tokens_per_s": 1.0,
        "mfu": 0.5,
        "peak_gib": 1.0,
        "gpu": "H100",
        "commit": "abc",
    }
    stale = {**keep, "model": "hybrid_tiny", "seq": 32, "precision": "bf16", "gpu": "cpu", "step_ms": -1.0}
    compiled = {**stale, "compiled": True}  # the same case compiled: another row, kept
    out.write_text(json.dumps([keep, stale, compiled]))
    proc = run_benchmark(
        "bench_train",
        *("--models", "hybrid_tiny", "--seqs", 32, "--batch", 2, "--steps", 1, "--warmup", 1),
        *("--precisions", "bf16", "--out", out, "--profile", tmp_path / "prof", "--host-profile", 6),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert keep in rows and compiled in rows and len(rows) == 3
    (new,) = [r for r in rows if r["model"] == "hybrid_tiny" and not r["compiled"]]
    assert set(new) == set(keep) | {"cuda_graph"} and new["cuda_graph"] is False  # a CPU step is never graphed
    assert new["seq"] == 32 and new["batch"] == 2 and new["step_ms"] > 0 and new["tokens_per_s"] > 0
    assert new["gpu"] == "cpu" and new["mfu"] is None and new["peak_gib"] is None
    # --profile: one more step under torch.profiler after the timed window, broken down by kind of kernel
    assert "profiled step:" in proc.stdout and "gemm" in proc.stdout and "top 15 kernels:" in proc.stdout
    assert (tmp_path / "prof" / "hybrid_tiny_seq32_bf16_emulated.json").stat().st_size > 0
    listing = (tmp_path / "prof" / "hybrid_tiny_seq32_bf16_emulated_kernels.txt").read_text().splitlines()
    top = next(line for line in listing if line.strip().startswith("top "))
    n = int(top.split()[1])  # every op the step ran, not the printed 15
    assert n > 15 and sum(1 for line in listing if " x" in line and "<-" not in line and "%" in line) == n
    # --host-profile: one more step under cProfile, the host's costliest functions and this package's
    host = proc.stdout[proc.stdout.index("host, one step under cProfile:") :].splitlines()
    own = host.index("    own time (calls, ms):")
    ours = host.index("    this package's functions, with what they call (calls, ms):")
    assert ours - own - 1 == 6 and "train_step (torch.py:" in host[ours + 1]  # the step itself comes first


def test_kernel_kinds_of_real_kernel_names():
    from nvfp4train.train.profiling import kernel_kind as kind

    assert kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert kind("_rht_nvfp4_kernel") == "quantize (ours)" and kind("_abs_max_kernel") == "quantize (ours)"
    assert kind("_chunk_scan_fwd_kernel") == "mamba scan" and kind("nvfp4train::ssd_scan_triton") == "mamba scan"
    assert kind("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>") == "copy / cast"


def test_torchao_like_for_like_row_converts_only_the_preset_quantized_blocks():
    from benchmarks import bench_train
    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig

    cfg = ModelConfig.from_dict({**load_preset("model", "hybrid_tiny"), "pattern": "M-M*M-"})
    model = HybridLM(cfg)
    linears = [fqn for fqn, m in model.blocks.named_modules() if isinstance(m, torch.nn.Linear)]
    assert bench_train.torchao_block_filter("torchao_float8", len(cfg.pattern)) is None  # every linear
    keep = bench_train.torchao_block_filter("torchao_float8_as_fp8_tensorwise", len(cfg.pattern))
    chosen = {fqn.split(".")[0] for fqn in linears if keep(model.blocks.get_submodule(fqn), fqn)}
    assert chosen == {"1", "2", "3"}  # fp8_tensorwise keeps the first block and the last two in BF16


def test_rows_of_two_gpu_models_are_both_kept(tmp_path):
    import benchmarks.bench_train as bt

    path = tmp_path / "train.json"
    row = {
        "model": "hybrid_1b",
        "seq": 4096,
        "precision": "bf16",
        "backend": "emulated",
        "compiled": True,
        "cuda_graph": True,
    }
    bt.merge_rows(path, [{**row, "gpu": "NVIDIA H100 80GB HBM3", "step_ms": 1.0}])
    bt.merge_rows(path, [{**row, "gpu": "NVIDIA H200", "step_ms": 2.0}])
    bt.merge_rows(path, [{**row, "gpu": "NVIDIA H200", "step_ms": 3.0}])  # the same GPU model: replaced
    assert sorted((r["gpu"], r["step_ms"]) for r in json.loads(path.read_text())) == [
        ("NVIDIA H100 80GB HBM3", 1.0),
        ("NVIDIA H200", 3.0),
    ]


def test_rows_against_the_bf16_row_of_the_same_run():
    """The closing table sets each row against the BF16 row of the same model, shape and CUDA-graph setting;
    a row without one (here the eager NVFP4 row) is left out."""
    from benchmarks.bench_train import against_bf16

    def row(precision, ms, graph=True, backend="emulated"):
        shape = {"model": "hybrid_1b", "seq": 4096, "batch": 4}
        return {**shape, "precision": precision, "backend": backend, "cuda_graph": graph, "step_ms": ms}

    rows = [row("bf16", 200.0), row("fp8_tensorwise", 160.0, backend="scaled_mm"), row("nvfp4", 220.0, graph=False)]
    lines = against_bf16(rows)
    assert lines[0] == "against bf16 in this run:" and len(lines) == 2
    assert "fp8_tensorwise" in lines[1] and "1.250x tokens/s" in lines[1] and "0.800x step" in lines[1]
    assert against_bf16(rows[1:]) == []  # no BF16 row: no table


def test_precision_set_gives_its_own_row_with_every_block_quantized(tmp_path):
    """--precision-set bf16_first=0 bf16_last=0: the preset with FP8 in every block, in a row named with its
    overrides beside the preset's own row; BF16 rows take no overrides."""
    import benchmarks.bench_train as bt
    from nvfp4train.config import load_preset
    from nvfp4train.model import ModelConfig

    cfg = ModelConfig.from_dict(load_preset("model", "hybrid_tiny"))
    every, _ = bt._model(cfg, "fp8_tensorwise", torch.device("cpu"), precision_set={"bf16_first": 0, "bf16_last": 0})
    preset, _ = bt._model(cfg, "fp8_tensorwise", torch.device("cpu"))
    from nvfp4train.precision import QuantLinear

    def quantized(model):
        return [all(m.quantized for m in b.modules() if isinstance(m, QuantLinear)) for b in model.blocks]

    assert quantized(every) == [True] * len(cfg.pattern)
    assert quantized(preset) == [False, *[True] * (len(cfg.pattern) - 3), False, False]
    out = tmp_path / "train.json"
    proc = run_benchmark(
        "bench_train",
        *("--models", "hybrid_tiny", "--seqs", 32, "--batch", 2, "--steps", 1, "--warmup", 1, "--compile", "false"),
        *("--precisions", "bf16", "fp8_tensorwise", "--precision-set", "bf16_first=0", "bf16_last=0", "--out", out),
        *("--profile", tmp_path / "prof"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(r["precision"] for r in json.loads(out.read_text())) == [
        "bf16",
        "fp8_tensorwise[bf16_first=0,bf16_last=0]",
    ]
    assert (tmp_path / "prof" / "hybrid_tiny_seq32_fp8_tensorwise_bf16_first_0_bf16_last_0_emulated.json").is_file()
    bad = run_benchmark(
        "bench_train",
        *("--models", "hybrid_tiny", "--seqs", 32, "--precisions", "fp8_tensorwise", "--out", out),
        *("--precision-set", "bf16_frist=0"),
    )
    assert bad.returncode != 0 and "bf16_frist" in bad.stderr.splitlines()[-1]
