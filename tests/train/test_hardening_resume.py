"""Hardening, round 2 (issue 38), through the real CLI: a resume that changes optim.* applies it; a
hand-edited param_groups, crafted rank/meta fields or a renamed checkpoint are refused in one line with
nothing written; a damaged metrics line costs only itself; a damaged `.metadata` is one line, not
DCP's tracebacks."""

import json
import shutil

import pytest
import torch

from tests.conftest import read_metrics, run_train

ARGS = [
    "train.progress=false",
    "train.eval_sequences=2",
    "train.seq_len=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=4",
    "train.log_every=1",
    "train.max_steps=4",
    "train.save_every=2",
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4 (copied per test, never changed)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run_train(f"out_dir={out}", *ARGS)
    return out


def _at_step_2(finished, tmp_path):
    """A copy of the run as if killed after step 2's checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "step_00000004")
    return out


def _snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".lock"}


def _refused(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_resume_applies_changed_optimizer_settings(finished, tmp_path):
    out = _at_step_2(finished, tmp_path)
    new = ["optim.eps=0.1", "optim.weight_decay=0.5", "optim.betas=[0.5,0.6]"]
    proc = run_train(f"out_dir={out}", *ARGS, *new)
    assert "resume changes optim.eps" in proc.stdout and "the new values apply from this step" in proc.stdout
    # what the optimizer itself held at step 4: the checkpoint records its param_groups
    groups = json.loads((out / "checkpoints" / "step_00000004" / "meta.json").read_text())["param_groups"]
    assert [(g["eps"], g["betas"]) for g in groups] == [(0.1, [0.5, 0.6])] * 2
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.5]
    before, after = read_metrics(finished), read_metrics(out)
    assert [r["step"] for r in after] == [1, 2, 3, 4]
    assert after[2]["loss"] == before[2]["loss"]  # step 3's loss is computed before its update
    assert after[3]["loss"] != before[3]["loss"], "the new optimizer settings changed nothing"
    assert "eps: 0.1" in (out / "config.yaml").read_text()


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda g: g[0].update(eps=-1e-8), ["param_groups[0].eps", "-1e-08"]),
        (lambda g: g.reverse(), ["param_groups[0].params", "differs"]),
        (lambda g: g[1].update(betas="0.9"), ["param_groups[1].betas"]),
        (lambda g: g.pop(), ["1 group(s)"]),
    ],
)
def test_hand_edited_param_groups_are_refused(finished, tmp_path, edit, words):
    out = _at_step_2(finished, tmp_path)
    meta_path = out / "checkpoints" / "step_00000002" / "meta.json"
    meta = json.loads(meta_path.read_text())
    edit(meta["param_groups"])
    meta_path.write_text(json.dumps(meta))
    before = _snapshot(out)
    _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(meta_path), *words)
    assert _snapshot(out) == before


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("guard", {"in_row": "x"}, ["'guard'"]),
        ("spikes", {}, ["'spikes'"]),
        ("precision", {"nonsense": 1}, ["'precision'"]),
    ],
)
def test_crafted_rank_file_fields_are_one_line(finished, tmp_path, field, value, words):
    out = _at_step_2(finished, tmp_path)
    rank_file = out / "checkpoints" / "step_00000002" / "rank_00000.pt"
    state = torch.load(rank_file, weights_only=True)
    state[field] = value
    torch.save(state, rank_file)
    before = _snapshot(out)
    _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(rank_file), *words)
    assert _snapshot(out) == before


@pytest.mark.parametrize("field, value", [("wandb_id", 7), ("run_config", "x"), ("healthy", "yes"), ("engine", [])])
def test_crafted_meta_fields_are_one_line(finished, tmp_path, field, value):
    out = _at_step_2(finished, tmp_path)
    meta_path = out / "checkpoints" / "step_00000002" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    before = _snapshot(out)
    _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(meta_path), f"field {field!r}")
    assert _snapshot(out) == before


def test_a_checkpoint_named_for_another_step_is_refused(finished, tmp_path):
    out = _at_step_2(finished, tmp_path)
    (out / "checkpoints" / "step_00000002").rename(out / "checkpoints" / "step_00000099")
    before = _snapshot(out)
    _refused(run_train(f"out_dir={out}", *ARGS, check=False), "records step 2", "named for step 99")
    assert _snapshot(out) == before


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_damaged_dcp_metadata_is_one_line_without_tracebacks(finished, tmp_path, damage):
    out = _at_step_2(finished, tmp_path)
    metadata = out / "checkpoints" / "step_00000002" / "model_optim" / ".metadata"
    if damage == "missing":
        metadata.unlink()
    else:
        metadata.write_bytes(b"\x80\x04garbage")
    proc = run_train(f"out_dir={out}", *ARGS, check=False)
    _refused(proc, str(metadata))
    assert "metadata is not found" not in proc.stdout + proc.stderr


def test_a_damaged_metrics_line_costs_only_itself(finished, tmp_path):
    out = _at_step_2(finished, tmp_path)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # steps 1-4: the copy was cut after step 2's checkpoint, its metrics were not
    lines[0] = lines[0][:40]  # step 1's record, torn
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    proc = run_train(f"out_dir={out}", *ARGS)
    assert "1 damaged line(s) skipped (line 1)" in proc.stdout, proc.stdout
    assert [r["step"] for r in read_metrics(out)] == [2, 3, 4]  # step 2 kept, 3 and 4 written again
    assert (out / "metrics.jsonl.damaged").read_text() == f"metrics.jsonl:1: {lines[0]}\n"
