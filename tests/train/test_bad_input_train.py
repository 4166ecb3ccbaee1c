"""Bad input to a training run, built the way it happens (a typo, a machine without a GPU or without an
extra, a hand-edited or damaged checkpoint, a resume with another world size): one `error:` line naming
the key or file and what is allowed, exit code 2, and out_dir neither created nor changed.

Values are checked in-process (the CLI prints the same ConfigError as one line: test_rundir.py and the
cases below that need a real subprocess show it)."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from nvfp4train.config import ConfigError, RunConfig, compose
from nvfp4train.launch.processes import run_and_kill_on_timeout
from nvfp4train.train import checkpoint
from nvfp4train.train.checkpoint import CheckpointError
from nvfp4train.train.loop import run
from tests.conftest import REPO, cli_env, run_train
from tests.train.test_checkpoint import load, make, rank_state, save

SMALL = [
    "train.max_steps=2",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
]


def config(out, *overrides) -> RunConfig:
    return RunConfig.from_omegaconf(compose("train", [f"out_dir={out}", *SMALL, *overrides]))


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


# ----------------------------------------------------------------------------- values taken wrongly
@pytest.mark.parametrize(
    "override, message",
    [
        ("train.spike_factor=abc", "train.spike_factor: expected float, got 'abc' (str)"),
        ("optim.lr=abc", "optim.lr: expected float, got 'abc' (str)"),
        ("train.wandb.enabled=no", "train.wandb.enabled: expected bool (true or false), got 'no' (str)"),
        ("train.compile=maybe", "train.compile='maybe': allowed auto, true, false"),
        ("train.eval_every=true", "train.eval_every: expected int, got True (bool)"),
        (
            "train.resume=/nonexistent/step_00000004",
            "train.resume='/nonexistent/step_00000004': not a checkpoint "
            "directory (allowed: auto, never, or the path of a checkpoint",
        ),
    ],
)
def test_a_bad_value_names_the_key_and_what_is_allowed(tmp_path, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config(tmp_path / "run", override)


# ---------------------------------------------------------------- refused before out_dir is created
def _te_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            ["train.device=cuda"],
            "train.device=cuda: no CUDA GPU is visible",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
        pytest.param(
            ["precision=nvfp4", "precision.backend=te"],
            "precision.backend='te' cannot run here",
            marks=pytest.mark.skipif(_te_importable(), reason="Transformer Engine is installed"),
        ),
        (["precision=nvfp4", "precision.backend=scaled_mm"], "precision.backend='scaled_mm' cannot run here"),
        pytest.param(
            ["model.ssd_backend=triton"],
            "model.ssd_backend=triton needs a CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
        # ~512e9 parameters: counted from the config, refused before a byte is allocated (train/fits.py)
        (
            ["model.vocab_size=2000000000"],
            r"model: 512,\d{3},\d{3},\d{3} parameters \(7,629.\d GiB of weights, gradients and AdamW state\)"
            r".*use a smaller model",
        ),
    ],
)
def test_what_cannot_run_here_is_refused_before_out_dir_exists(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run(config(tmp_path / "run", *overrides))
    assert not (tmp_path / "run").exists()


BLOCK_DEEPSPEED = """
import sys
class _NoDeepSpeed:  # `import deepspeed` fails as it does where the package is not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "deepspeed":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoDeepSpeed())
"""


@pytest.mark.parametrize("case", ["deepspeed_missing", "triton_on_cpu", "bad_resume_path"])
def test_cli_refusals_are_one_line_and_leave_no_out_dir(tmp_path, case):
    out = tmp_path / "run"
    env = cli_env()
    if case == "deepspeed_missing":
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_DEEPSPEED)
        env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env['PYTHONPATH']}"
        extra, message = (
            ["train.parallel=deepspeed"],
            (
                "train.parallel=deepspeed: deepspeed cannot be imported "
                "(ModuleNotFoundError: No module named 'deepspeed'); "
                "pip install 'nvfp4train[deepspeed]'"
            ),
        )
    elif case == "triton_on_cpu":
        if torch.cuda.is_available():
            pytest.skip("a GPU is visible")
        extra, message = ["model.ssd_backend=triton"], "model.ssd_backend=triton needs a CUDA GPU"
    else:
        extra, message = [f"train.resume={tmp_path / 'typo'}"], "not a checkpoint directory"
    proc = run_and_kill_on_timeout(
        [sys.executable, "-m", "nvfp4train.train", f"out_dir={out}", *SMALL, *extra],
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert message in one_error_line(proc)
    assert not out.exists()


# -------------------------------------------------------------------------- damaged checkpoints
@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "meta.json: holds a list, not a mapping"),
        ('{"step": 2, "world_size": 1}', "meta.json: field 'model_config' missing"),
        ('{"step": "two", "world_size": 1, "model_config": {}}', "meta.json: field 'step' is a str, expected int"),
        (
            '{"step": -1, "world_size": 1, "model_config": {}}',
            "meta.json: step=-1, world_size=1 are not a checkpoint's",
        ),
        ('{"step": 2, "world_si', r"meta.json: unreadable \(Unterminated string"),  # a torn write
    ],
)
def test_malformed_meta_json_is_one_line(tmp_path, text, message):
    model, engine = make()
    path = save(tmp_path, 2, model, engine)
    (path / "meta.json").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        load(path, engine)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("list", "rank_00000.pt: holds a list, not a mapping"),
        ("missing_field", "rank_00000.pt: field 'precision' missing"),
        ("wrong_type", "rank_00000.pt: field 'guard' is a Tensor, expected dict"),
        ("bad_rng", "rank_00000.pt: rng_cpu is not a CPU generator state"),
        ("truncated", r"rank_00000.pt: unreadable \("),
    ],
)
def test_malformed_rank_file_is_one_line(tmp_path, damage, message):
    model, engine = make()
    path = save(tmp_path, 2, model, engine)
    rank_file = path / "rank_00000.pt"
    if damage == "truncated":
        rank_file.write_bytes(rank_file.read_bytes()[:100])
    else:
        content = {
            "list": [1, 2],
            "missing_field": {"loader": {}},
            "wrong_type": dict(rank_state(2), guard=torch.zeros(2)),
            "bad_rng": dict(rank_state(2), rng_cpu=torch.zeros(3, dtype=torch.uint8)),
        }[damage]
        torch.save(content, rank_file)
    with pytest.raises(CheckpointError, match=message):
        load(path, engine)


def test_missing_dcp_metadata_is_one_line(tmp_path):
    model, engine = make()
    path = save(tmp_path, 2, model, engine)
    (path / "model_optim" / ".metadata").unlink()  # a copy that skipped dot-files
    with pytest.raises(CheckpointError, match=r"model_optim/.metadata missing: the checkpoint is incomplete"):
        load(path, engine)


def test_another_world_size_is_refused_from_meta_json(tmp_path):
    model, engine = make()
    path = save(tmp_path, 2, model, engine)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps(dict(meta, world_size=2)))
    with pytest.raises(CheckpointError, match=r"written by 2 rank\(s\), this run has 1: exact resume"):
        load(path, engine)


def test_resuming_a_one_rank_checkpoint_on_two_ranks_is_one_line_per_rank(tmp_path):
    """Both ranks read meta.json and refuse before any collective: no gloo error, no traceback of ours.
    torchrun then reports the failed child in its own words (its ChildFailedError block, exit code 1)."""
    out, args = tmp_path / "run", [a for a in SMALL if not a.startswith("train.micro_batch_size")]
    run_train(f"out_dir={out}", *args)
    proc = run_and_kill_on_timeout(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "nvfp4train.train",
            f"out_dir={out}",
            *args,
            "train.max_steps=4",
        ],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS=1),
        timeout=300,
    )
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert ours and all("was written by 1 rank(s), this run has 2" in ln for ln in ours), proc.stderr[-3000:]
    assert "nvfp4train/" not in proc.stderr and "gloo" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")] == ["step_00000002"]
