"""benchmarks/scaling_model.py: the arithmetic of FSDP2's step time versus GPU count."""

import json
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import scaling_model as sm

NET = sm.Network(intra_bus_gbytes=100.0, inter_bus_gbytes=10.0, gpus_per_node=8, intra_source="t", inter_source="t")
SETUP = sm.Setup(
    "m",
    params=10**9,
    blocks=10,
    root_params=10**8,
    flops_per_token=6e9,
    seq=1000,
    micro=2,
    micro_batches=3,
    one_gpu_tokens_per_s=6000.0,
    throughput_source="t",
)


def test_one_gpu_is_pure_compute():
    row = sm.fsdp2_step(SETUP, 1, NET, reshard=True)
    assert row["step_s"] == pytest.approx(6000 / 6000) and row["wire_s"] == 0


def test_fsdp2_bytes_on_the_wire():
    """Per micro-batch one BF16 all-gather (two when resharding); one FP32 reduce-scatter per step."""
    keep = sm.fsdp2_step(SETUP, 4, NET, reshard=False)
    # (N-1)/N * (3 micro-batches * 2 bytes * P + 4 bytes * P) / 100 GB/s
    assert keep["wire_s"] == pytest.approx(0.75 * (3 * 2e9 + 4e9) / 100e9)
    reshard = sm.fsdp2_step(SETUP, 4, NET, reshard=True)
    assert reshard["wire_s"] == pytest.approx(0.75 * (3 * 2 * 2e9 + 4e9) / 100e9)
    assert keep["exposed_s"] == pytest.approx(0.75 * 6 * 1e8 / 100e9)  # the root's gather and reduce-scatter
    assert keep["step_s"] == pytest.approx(1.0 + keep["exposed_s"])  # compute-bound: the wire is hidden


def test_crossing_nodes_uses_the_network_and_can_become_wire_bound():
    inside, across = sm.fsdp2_step(SETUP, 8, NET, True), sm.fsdp2_step(SETUP, 16, NET, True)
    assert across["wire_s"] / inside["wire_s"] == pytest.approx(10 * (15 / 16) / (7 / 8))
    assert across["step_s"] == pytest.approx(across["wire_s"] + across["exposed_s"])  # wire-bound
    assert across["per_gpu_efficiency"] < 1 / 1.5


def test_hsdp_keeps_gathers_on_nvlink():
    fsdp, hsdp = sm.fsdp2_step(SETUP, 16, NET, True), sm.hsdp_step(SETUP, 16, NET, True)
    assert hsdp["tokens_per_s"] > fsdp["tokens_per_s"]
    assert sm.hsdp_step(SETUP, 8, NET, True) == sm.fsdp2_step(SETUP, 8, NET, True)


def test_calibrated_overhead_reproduces_the_measurement():
    ref = sm.setup_for("hybrid_1b", 4096, 4, 1)
    net = sm.network_from(None, 400, 8)
    for label, reshard in (("fsdp2_reshard", True), ("fsdp2_keep", False)):
        measured = sm.REFERENCE["two_gpu_tokens_per_s"][label]
        over = sm.calibrate_overhead(ref, net, measured, reshard)
        assert sm.fsdp2_step(ref, 2, net, reshard, over)["tokens_per_s"] == pytest.approx(measured)


def test_auto_reshard_matches_the_trainer_policy():
    from nvfp4train import parallel

    assert sm.KEEP_GATHERED_MAX_SHARE == parallel.KEEP_GATHERED_MAX_SHARE
    assert sm.reshard_auto(sm.MODELS["hybrid_1b"]["params"]) is False
    assert sm.reshard_auto(sm.MODELS["nemotron_h_8b"]["params"]) is True


def test_slurm_line_and_measured_bandwidth(tmp_path):
    line = sm.slurm_command("hybrid_1b", 16, 8)
    assert "--nodes=2" in line and "train.global_batch_size=64" in line and "train.micro_batch_size=4" in line
    assert line.endswith("train.parallel=fsdp2") and sm.slurm_command("hybrid_1b", 16, 8, layout="hsdp").endswith(
        "train.parallel=hsdp"
    )
    comm = tmp_path / "comm.json"
    comm.write_text(
        json.dumps(
            {
                "rows": [
                    {"op": "all_gather", "bytes": 10**8, "bus_gbytes": 250.0, "world_size": 2},
                    {"op": "reduce_scatter", "bytes": 10**8, "bus_gbytes": 200.0, "world_size": 2},
                    {"op": "all_gather", "bytes": 10**6, "bus_gbytes": 20.0, "world_size": 2},
                ]
            }
        )
    )
    net = sm.network_from(comm, 400, 8)
    assert net.intra_bus_gbytes == 200.0 and "measured" in net.intra_source and net.inter_bus_gbytes == 50.0


def test_model_numbers_are_the_presets():
    """MODELS' parameter counts are those of configs/model/*.yaml (built on the meta device)."""
    import torch

    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig, flops_per_token

    for name, m in sm.MODELS.items():
        cfg = ModelConfig.from_dict(load_preset("model", name))
        with torch.device("meta"):
            assert sum(p.numel() for p in HybridLM(cfg).parameters()) == m["params"]
        assert len(cfg.pattern) == m["blocks"]
        with torch.device("meta"):
            model = HybridLM(cfg)
        assert m["params"] - sum(p.numel() for b in model.blocks for p in b.parameters()) == m["root_params"]
        assert flops_per_token(cfg, 4096)["total"] == pytest.approx(m["flops_per_token"])
