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


# ------------------------------------------------------------------------------ round 3 (issue 61)
def _history(out):
    return (out / "metrics.jsonl").read_bytes(), (out / "config.yaml").read_bytes()


@pytest.mark.parametrize("damage", ["missing", "empty", "dangling-link", "incomplete"])
def test_auto_resume_without_a_checkpoint_never_rewrites_the_history(finished, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    ckpts = out / "checkpoints"
    shutil.rmtree(ckpts)
    if damage == "empty":
        ckpts.mkdir()
    elif damage == "dangling-link":
        ckpts.symlink_to(out / "checkpoints.gone")
    elif damage == "incomplete":  # a save killed before its meta.json: not a checkpoint to resume from
        shutil.copytree(finished / "checkpoints" / "step_00000002", ckpts / "step_00000002")
        (ckpts / "step_00000002" / "meta.json").unlink()
    history = _history(out)
    line = _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(out))
    if damage == "dangling-link":
        assert "does not exist" in line, line
    else:
        assert "history" in line and "train.overwrite=true" in line and ".replaced-" in line, line
    assert _history(out) == history
    assert not list(tmp_path.glob("run.replaced-*"))


def test_overwrite_moves_a_history_without_checkpoints_aside(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints")
    history = _history(out)
    run_train(f"out_dir={out}", *ARGS, "train.overwrite=true")
    (aside,) = tmp_path.glob("run.replaced-*")
    assert _history(aside) == history
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]


@pytest.mark.parametrize("trick", ["tmp-link", "tmp-file", "checkpoints-file", "checkpoints-link-out"])
def test_links_and_files_where_checkpoints_are_written_are_one_line(finished, tmp_path, trick):
    out = _at_step_2(finished, tmp_path)
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "keep.txt").write_text("a user's file")
    ckpts = out / "checkpoints"
    if trick == "tmp-link":  # the next save would remove a stale step_N.tmp: it must not reach through it
        (ckpts / "step_00000004.tmp").symlink_to(victim)
    elif trick == "tmp-file":
        (ckpts / "step_00000004.tmp").write_text("not a checkpoint")
    elif trick == "checkpoints-file":
        shutil.rmtree(ckpts)
        ckpts.write_text("not a directory")
    else:
        shutil.copytree(ckpts, victim / "checkpoints")
        shutil.rmtree(ckpts)
        ckpts.symlink_to(victim / "checkpoints")
    before, outside = _snapshot(out), _snapshot(victim)
    line = _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(ckpts))
    assert {"tmp-link": "is a link", "tmp-file": "is a file", "checkpoints-file": "is a file"}.get(
        trick, "link out of the run directory"
    ) in line, line
    assert _snapshot(out) == before and _snapshot(victim) == outside


@pytest.mark.parametrize("tensor", ["model.blocks.0.mixer.A_log", "optim.embedding.weight.exp_avg_sq"])
def test_a_checkpoint_with_nan_weights_or_moments_is_refused_on_resume(finished, tmp_path, tensor):
    from tests.conftest import poison_checkpoint

    out = _at_step_2(finished, tmp_path)
    ckpt = out / "checkpoints" / "step_00000002"
    poison_checkpoint(ckpt, tensor)
    before = _snapshot(out)
    line = _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(ckpt), "NaN or inf")
    assert tensor.split(".", 1)[1] in line, line
    assert _snapshot(out) == before


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda loader: loader.pop("fingerprint"), ["'loader.fingerprint' missing"]),
        (lambda loader: loader.update(microbatch=7), ["'loader.microbatch' is 7", "expected 0 to 0"]),
        (lambda loader: loader.update(microbatch=-1), ["'loader.microbatch' is -1"]),
        (lambda loader: loader.update(consumed_samples="8"), ["'loader.consumed_samples' is a str"]),
        (lambda loader: loader.update(fingerprint=[1]), ["'loader.fingerprint' is a list"]),
        (lambda loader: loader["source_samples"].update(x=1.5), ["'loader.source_samples.x' is 1.5"]),
    ],
)
def test_crafted_data_position_fields_are_one_line(finished, tmp_path, edit, words):
    out = _at_step_2(finished, tmp_path)
    rank_file = out / "checkpoints" / "step_00000002" / "rank_00000.pt"
    state = torch.load(rank_file, weights_only=True)
    edit(state["loader"])
    torch.save(state, rank_file)
    before = _snapshot(out)
    _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(rank_file), *words)
    assert _snapshot(out) == before


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """A run of the same config as `finished` in another out_dir: the same shapes, another run."""
    out = tmp_path_factory.mktemp("other") / "run"
    run_train(f"out_dir={out}", *ARGS, "optim.lr=0.01")
    return out


def test_a_checkpoint_of_another_run_is_refused_unless_asked(finished, other_run, tmp_path):
    out = _at_step_2(finished, tmp_path)
    foreign = out / "checkpoints" / "step_00000004"
    shutil.copytree(other_run / "checkpoints" / "step_00000004", foreign)
    before = _snapshot(out)
    line = _refused(run_train(f"out_dir={out}", *ARGS, check=False), str(foreign), "another run", "run_id")
    assert "train.resume_foreign=true" in line, line
    assert _snapshot(out) == before
    # the same checkpoint named explicitly: refused too, then continued when asked
    named = [f"train.resume={foreign}", "train.max_steps=6"]
    _refused(run_train(f"out_dir={out}", *ARGS, *named, check=False), str(foreign), "another run")
    proc = run_train(f"out_dir={out}", *ARGS, *named, "train.resume_foreign=true")
    assert "a checkpoint of another run" in proc.stdout, proc.stdout
    ours = json.loads((out / "checkpoints" / "step_00000002" / "meta.json").read_text())["identity"]
    new = json.loads((out / "checkpoints" / "step_00000006" / "meta.json").read_text())["identity"]
    assert new["run_id"] == ours["run_id"]  # the continued timeline keeps this out_dir's identity


def test_a_checkpoint_without_identity_is_resumed_with_a_note(finished, tmp_path):
    out = _at_step_2(finished, tmp_path)
    for meta_path in (out / "checkpoints").glob("step_*/meta.json"):
        meta = json.loads(meta_path.read_text())
        meta.pop("identity")
        meta_path.write_text(json.dumps(meta))
    proc = run_train(f"out_dir={out}", *ARGS)
    assert "records no run identity" in proc.stdout, proc.stdout
    assert "identity" in json.loads((out / "checkpoints" / "step_00000004" / "meta.json").read_text())


def test_a_halt_right_after_a_resume_does_not_advise_the_same_checkpoint(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    diverge = [
        "train.max_steps=60",
        "optim.lr=1e4",
        "optim.min_lr=0",
        "train.save_every=0",
        "train.max_nonfinite_steps=2",
    ]
    proc = run_train(f"out_dir={out}", *ARGS, *diverge, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr[-3000:]
    assert "this run resumed from it and halted" in lines[0] and "resume from it with" not in lines[0], lines[0]
