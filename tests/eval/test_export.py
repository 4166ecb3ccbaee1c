"""`python -m nvfp4train.export`: one safetensors file + config.json from any checkpoint, readable with
safetensors alone, giving the same model as the checkpoint (round trip)."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from nvfp4train.eval import load_run_model
from nvfp4train.export import load_export, main
from tests.conftest import REPO, cli_env, run_train
from tests.eval.conftest import TINY


def assert_round_trip(run_dir, out):
    model, _, ckpt = load_run_model(run_dir)
    state = load_file(str(out / "model.safetensors"))  # safetensors only: no nvfp4train code involved
    expected = model.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    assert config["step"] == json.loads((ckpt / "meta.json").read_text())["step"]
    exported, _ = load_export(out)
    ids = torch.randint(0, config["model"]["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(ids), model(ids))
    return config


def test_export_cli_round_trip(tiny_run, tmp_path):
    out = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-m", "nvfp4train.export", f"run_dir={tiny_run}", f"out={out}"],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["out"] == str(out)
    config = assert_round_trip(tiny_run, out)
    assert config["model"]["pattern"] == "M-*-M-" and config["dtype"] == "float32"
    assert (out / "tokenizer.json").is_file() and config["tokenizer_file"] == "tokenizer.json"


def test_export_bad_input_writes_nothing(tiny_run, tmp_path, capsys):
    assert main([f"run_dir={tiny_run}", f"out={tmp_path / 'x'}", "dtype=fp8"]) == 2
    assert capsys.readouterr().err.strip() == "error: dtype='fp8': allowed: float32, bfloat16"
    assert main([f"run_dir={tmp_path}", f"out={tmp_path / 'x'}"]) == 2
    assert "config.yaml not found" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_export_consolidates_fsdp2_shards(tmp_path):
    run_dir = tmp_path / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "nvfp4train.train", f"out_dir={run_dir}", "train.parallel=fsdp2", *TINY, "train.micro_batch_size=2"]
    proc = subprocess.run(cmd, cwd=REPO, env=cli_env(OMP_NUM_THREADS=1), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = list((run_dir / "checkpoints" / "step_00000004" / "model_optim").glob("*.distcp"))
    assert len(shards) == 2
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'export'}"]) == 0
    assert assert_round_trip(run_dir, tmp_path / "export")["world_size"] == 2


@pytest.mark.slow
def test_export_deepspeed_checkpoint(tmp_path):
    pytest.importorskip("deepspeed")
    run_dir = tmp_path / "ds"
    run_train(f"out_dir={run_dir}", "train.parallel=deepspeed", *TINY, "train.micro_batch_size=2")
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'export'}"]) == 0
    assert assert_round_trip(run_dir, tmp_path / "export")["engine"] == "deepspeed"
