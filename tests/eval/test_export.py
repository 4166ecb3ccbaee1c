"""`python -m nvfp4train.export`: a Hugging Face model directory from any checkpoint, with the checkpoint's
weights under Nemotron-H's names, readable with safetensors alone and back into nvfp4train's model."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from nvfp4train.eval import load_run_model
from nvfp4train.export import from_hf_state, load_export, main
from nvfp4train.launch.processes import run_and_kill_on_timeout
from tests.conftest import REPO, cli_env, run_train
from tests.eval.conftest import TINY


def assert_round_trip(run_dir, out):
    model, _, ckpt = load_run_model(run_dir)
    state = load_file(str(out / "model.safetensors"))  # safetensors only: no nvfp4train code involved
    assert "model.embeddings.weight" in state and "lm_head.weight" in state
    back = from_hf_state(state)
    expected = model.state_dict()
    assert back.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    assert config["nvfp4train"]["step"] == json.loads((ckpt / "meta.json").read_text())["step"]
    exported, _ = load_export(out)
    ids = torch.randint(0, config["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(ids), model(ids))
    return config


def test_export_cli_writes_a_hugging_face_directory(tiny_run, tmp_path):
    out = tmp_path / "export"
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", "nvfp4train.export", f"run_dir={tiny_run}", f"out={out}"],
        cwd=REPO,
        env=cli_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["out"] == str(out)
    config = assert_round_trip(tiny_run, out)
    assert config["model_type"] == "nemotron_h" and config["architectures"] == ["NemotronHForCausalLM"]
    assert config["hybrid_override_pattern"] == "M-*-M-" and config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is False and config["time_step_min"] < 1e-9
    assert config["nvfp4train"]["model"]["pattern"] == "M-*-M-"
    state = load_file(str(out / "model.safetensors"))
    assert state["model.layers.2.mixer.q_proj.weight"].shape == (4 * 32, 128)  # hybrid_tiny: 4 heads of 32
    assert state["model.layers.2.mixer.k_proj.weight"].shape == (2 * 32, 128)
    assert "model.layers.1.mixer.up_proj.weight" in state and "model.layers.0.mixer.A_log" in state
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|endoftext|>" and config["eos_token_id"] == 0
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode("Hello world").ids  # a tokenizer, rewritten


def test_export_refuses_to_overwrite_unless_asked(tiny_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main([f"run_dir={tiny_run}", f"out={out}"]) == 0
    (out / "model.safetensors").write_bytes(b"older")
    assert main([f"run_dir={tiny_run}", f"out={out}"]) == 2
    assert capsys.readouterr().err.strip() == f"error: out='{out}': already exists; pass overwrite=true to replace it"
    assert (out / "model.safetensors").read_bytes() == b"older"
    assert main([f"run_dir={tiny_run}", f"out={out}", "overwrite=true"]) == 0
    assert_round_trip(tiny_run, out)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main([f"run_dir={tiny_run}", f"out={other}", "overwrite=true"]) == 2
    assert "is not an nvfp4train export; not replaced" in capsys.readouterr().err
    assert (other / "keep.txt").read_text() == "mine" and len(list(other.iterdir())) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary directory left


def test_export_bad_input_writes_nothing(tiny_run, tmp_path, capsys):
    assert main([f"run_dir={tiny_run}", f"out={tmp_path / 'x'}", "dtype=fp8"]) == 2
    assert capsys.readouterr().err.strip() == "error: dtype='fp8': allowed float32, bfloat16"
    assert main([f"run_dir={tmp_path}", f"out={tmp_path / 'x'}"]) == 2
    assert "config.yaml not found" in capsys.readouterr().err
    assert main([f"run_dir={tiny_run}", f"out={tmp_path / 'x'}", "overwrite=maybe"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: overwrite")
    assert not (tmp_path / "x").exists()


def test_export_refuses_a_rope_model_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "rope"
    run_train(f"out_dir={run_dir}", "model.rope=true", *TINY)
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.rope=true" in err and "no Nemotron-H equivalent" in err
    assert not (tmp_path / "x").exists()


def test_export_of_a_tokenizer_path_that_is_no_tokenizer_is_refused(tiny_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(tiny_run / "checkpoints")
    secret = tmp_path / "secret.json"
    secret.write_text('{"api_key": "do-not-copy"}')
    config = (tiny_run / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(config.replace("tokenizer: data/tokenizer/bpe8k.json", f"tokenizer: {secret}"))
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: data.tokenizer='{secret}':") and "unreadable" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_export_consolidates_fsdp2_shards(tmp_path):
    run_dir = tmp_path / "fsdp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "nvfp4train.train",
        f"out_dir={run_dir}",
        "train.parallel=fsdp2",
        *TINY,
        "train.micro_batch_size=2",
    ]
    proc = run_and_kill_on_timeout(cmd, cwd=REPO, env=cli_env(OMP_NUM_THREADS=1), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = list((run_dir / "checkpoints" / "step_00000004" / "model_optim").glob("*.distcp"))
    assert len(shards) == 2
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'export'}"]) == 0
    assert assert_round_trip(run_dir, tmp_path / "export")["nvfp4train"]["world_size"] == 2


@pytest.mark.slow
def test_export_deepspeed_checkpoint(tmp_path):
    pytest.importorskip("deepspeed")
    run_dir = tmp_path / "ds"
    run_train(f"out_dir={run_dir}", "train.parallel=deepspeed", *TINY, "train.micro_batch_size=2")
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'export'}"]) == 0
    assert assert_round_trip(run_dir, tmp_path / "export")["nvfp4train"]["engine"] == "deepspeed"


def test_export_overwrite_keeps_the_files_a_user_added(tiny_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main([f"run_dir={tiny_run}", f"out={out}"]) == 0
    (out / "README.md").write_text("# my model card\n")
    (out / "adapter").mkdir()
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"lora")
    (out / "model.safetensors").write_bytes(b"older")  # export's own: replaced
    capsys.readouterr()
    assert main([f"run_dir={tiny_run}", f"out={out}", "overwrite=true"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{out}: kept README.md, adapter/ (not written by export)"), err
    assert (out / "README.md").read_text() == "# my model card\n"
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == b"lora"
    assert_round_trip(tiny_run, out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_to_a_symbolic_link_is_refused(tiny_run, tmp_path, capsys):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    (tmp_path / "out").symlink_to(target)
    assert main([f"run_dir={tiny_run}", f"out={tmp_path / 'out'}", "overwrite=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: out='{tmp_path / 'out'}' is a symbolic link (to {target}); an export directory must be its own: "
        "remove the link or choose another out"
    )
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"] and (target / "keep.txt").read_text() == "mine"


def test_sigterm_during_export_removes_its_temporary_directory(tiny_run, tmp_path):
    """SIGTERM once the temporary directory exists (polled: the export takes a fraction of a second there, so
    a try that misses it, the export already done, is made again)."""
    import os
    import signal
    import subprocess
    import time

    for attempt in range(5):
        parent = tmp_path / f"try{attempt}"
        parent.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvfp4train.export", f"run_dir={tiny_run}", f"out={parent / 'model'}"],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not any(n.startswith(".model.") for n in os.listdir(parent))
        ):
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode == 0:
            continue  # finished before the signal: try again
        assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, stderr[-3000:])
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: export stopped by SIGTERM: "), stderr[-3000:]
        assert "Traceback" not in stderr and os.listdir(parent) in ([], ["model"]), os.listdir(parent)
        return
    pytest.skip("the export finished before SIGTERM could reach it in 5 tries")
