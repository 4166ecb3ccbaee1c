"""Checkpoints written before the quantized linears stored their SR seeds and RHT signs (`sr_seeds`,
`rht_signs` buffers) still resume bit for bit: each layer keeps the values the run's seed and precision
config give it, which are the values the writing run used, and the trainer says so in one line."""

import json
import shutil

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from nvfp4train.train import resume_policy
from tests.conftest import read_metrics, run_train

ARGS = [
    "train.max_steps=6",
    "train.save_every=3",
    "train.log_every=1",
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=64",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "precision=nvfp4",
    "precision.bf16_first=0",
    "precision.bf16_last=0",
]  # every linear quantized, SR on


def _strip_precision_buffers(ckpt, scratch) -> int:
    """Rewrite ckpt's DCP shards without the seed and sign buffers, as a checkpoint of before them."""
    flat = scratch / "flat.pt"
    dcp_to_torch_save(ckpt / "model_optim", flat)
    state = torch.load(flat, weights_only=True)
    doomed = [k for k in state["model"] if k.endswith((".sr_seeds", ".rht_signs"))]
    for k in doomed:
        del state["model"][k]
    shutil.rmtree(ckpt / "model_optim")
    dcp.save(state, checkpoint_id=str(ckpt / "model_optim"))
    return len(doomed)


def _resume_from_step_3(ref, out, strip: bool, scratch):
    shutil.copytree(ref, out)
    shutil.rmtree(out / "checkpoints" / "step_00000006")
    if strip:
        assert _strip_precision_buffers(out / "checkpoints" / "step_00000003", scratch) > 0
    assert json.loads((out / "checkpoints" / "step_00000003" / "meta.json").read_text())["step"] == 3
    resumed = run_train(f"out_dir={out}", *ARGS)
    assert "resumed from" in resumed.stdout
    after = {}
    for r in read_metrics(out):
        after[r["step"]] = r["loss"]  # the resumed run's record of a step is the last one
    return after


def test_a_checkpoint_without_the_seed_and_sign_buffers_resumes_bit_for_bit(tmp_path):
    ref = tmp_path / "ref"
    run_train(f"out_dir={ref}", *ARGS)
    losses = {r["step"]: r["loss"] for r in read_metrics(ref)}
    assert sorted(losses) == list(range(1, 7))

    current = _resume_from_step_3(ref, tmp_path / "current", strip=False, scratch=tmp_path)
    assert all(current[s] == losses[s] for s in range(4, 7))
    assert "seed / RHT sign buffer" not in (tmp_path / "current" / "train.log").read_text()

    old = tmp_path / "old"
    after = _resume_from_step_3(ref, old, strip=True, scratch=tmp_path)
    # one line in the run's log (train.log; the terminal shows warnings only): nothing for the user to do
    notes = [line for line in (old / "train.log").read_text().splitlines() if "seed / RHT sign buffer" in line]
    assert len(notes) == 1 and "step_00000003" in notes[0] and "keeps the value" in notes[0]
    assert all(after[s] == losses[s] for s in range(4, 7)), [(s, losses[s], after[s]) for s in range(4, 7)]


def test_resuming_a_run_recorded_with_the_retired_bf16_keys_notes_no_precision_change():
    """meta.json's run_config of an older run has bf16_{side}_blocks / _fraction; the same preset today says
    bf16_{side}: the resume check reads the record in today's keys, so nothing is reported as changed."""
    old = {
        "seed": 1,
        "precision": {
            "name": "nvfp4",
            "format": "nvfp4",
            "bf16_first_blocks": 0,
            "bf16_first_fraction": 0.03,
            "bf16_last_blocks": 0,
            "bf16_last_fraction": 0.13,
        },
    }
    new = {"seed": 1, "precision": {"name": "nvfp4", "format": "nvfp4", "bf16_first": 0.03, "bf16_last": 0.13}}
    assert resume_policy.check(old, new, "ckpt") == []
    changed = dict(new, precision=dict(new["precision"], bf16_last=4))
    assert resume_policy.check(old, changed, "ckpt") == [
        "resume changes precision.bf16_last: 0.13 -> 4 (a precision switch on resume; the weights and optimizer "
        "state carry over)"
    ]
