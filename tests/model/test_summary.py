import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_summary(*args):
    return subprocess.run(
        [sys.executable, "-m", "nvfp4train.summary", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_summary_12b_last_line_is_json():
    result = run_summary("model=nemotron_h_12b", "train.seq_len=8192")
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["params"] == pytest.approx(12.31e9, rel=0.01)
    assert 7e10 < last["flops_per_token"] < 9e10
    assert "mamba" in result.stdout and "attention" in result.stdout and "mlp" in result.stdout


def test_summary_overrides_and_errors():
    from nvfp4train.summary import load_model_config, summarize

    cfg, seq_len = load_model_config(["model=hybrid_tiny", "model.d_model=192", "model.rope=true", "seq_len=256"])
    assert cfg.d_model == 192 and cfg.rope is True and seq_len == 256
    base = summarize(load_model_config(["model=hybrid_tiny"])[0], 256)
    assert summarize(cfg, 256)["params"] > base["params"]
    for bad, word in [
        (["model=nope"], "no such model config"),
        (["model.nope=1"], "unknown key 'nope'"),
        (["model.pattern=M-Q"], "model.pattern"),
        (["lr=1"], "unknown key 'lr'"),
    ]:
        with pytest.raises(ValueError, match=word):
            load_model_config(bad)
    result = run_summary("model.n_kv_heads=3")
    assert result.returncode == 2 and "n_kv_heads" in result.stderr


def test_summary_defaults_to_the_training_seq_len_and_has_help():
    from nvfp4train.config import TrainConfig
    from nvfp4train.summary import load_model_config

    assert load_model_config(["model=hybrid_tiny"])[1] == TrainConfig().seq_len == 128
    assert load_model_config(["train.seq_len=8192"])[1] == 8192
    result = run_summary("model=hybrid_tiny")
    assert "at seq_len 128" in result.stdout
    for flag in ("--help", "-h"):
        result = run_summary(flag)
        assert result.returncode == 0 and "train.seq_len=N" in result.stdout, result.stderr
