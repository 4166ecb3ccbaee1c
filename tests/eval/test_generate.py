"""`python -m nvfp4train.generate`: text sampled from a run's checkpoint with the decode cache; greedy
decoding gives the tokens of a full forward per token; the same seed gives the same text."""

import json
import subprocess
import sys

import torch

from nvfp4train.data import load_tokenizer
from nvfp4train.eval import load_run_model
from nvfp4train.generate import generate, main
from tests.conftest import REPO, cli_env

PROMPT = "The history of the city, 1, 2: [x]"


def reference_greedy(model, ids: list[int], n: int, eos_id: int) -> list[int]:
    """Greedy decoding with a full forward over the whole sequence for every token (no cache)."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids + out]))[0, -1].argmax())
            if nxt == eos_id:
                break
            out.append(nxt)
    return out


def test_generate_cli_greedy_matches_full_forward_decoding(tiny_run):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.generate",
            f"run_dir={tiny_run}",
            f"prompt={PROMPT}",
            "temperature=0",
            "max_new_tokens=40",
            "json=true",
        ],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["prompt"] == PROMPT  # verbatim: not parsed as a list or a number
    model, config, _ = load_run_model(tiny_run)
    tokenizer = load_tokenizer(config["data"]["tokenizer"])
    expected = reference_greedy(model, tokenizer.encode(PROMPT), 40, tokenizer.eos_id)
    assert line["text"] == tokenizer.decode(expected) and line["tokens"] == len(expected)


def test_sampling_is_seeded_and_top_k_1_is_greedy(tiny_run):
    model, config, _ = load_run_model(tiny_run)
    ids = load_tokenizer(config["data"]["tokenizer"]).encode(PROMPT)
    a = generate(model, ids, 30, temperature=1.0, top_k=50, num_samples=3, seed=7)
    assert a == generate(model, ids, 30, temperature=1.0, top_k=50, num_samples=3, seed=7)
    assert a != generate(model, ids, 30, temperature=1.0, top_k=50, num_samples=3, seed=8)
    assert len({tuple(s) for s in a}) == 3  # the samples of one call differ
    greedy = generate(model, ids, 30, temperature=0)
    assert generate(model, ids, 30, temperature=1.0, top_k=1, seed=3) == greedy


def test_generate_help_and_bad_input(tiny_run, capsys):
    assert main(["--help"]) == 0
    assert "max_new_tokens" in capsys.readouterr().out
    for args, message in [
        ([f"run_dir={tiny_run}", "temperature=-1"], "error: temperature=-1.0: must be >= 0"),
        ([f"run_dir={tiny_run}", "top_kk=3"], "error: unknown key 'top_kk'; allowed: run_dir"),
        ([f"run_dir={tiny_run}", "max_new_tokens=0"], "error: max_new_tokens=0: must be a positive"),
        ([f"run_dir={tiny_run / 'nope'}"], "error: run_dir="),
    ]:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(message) and len(err.splitlines()) == 1, err


def test_an_absurd_max_new_tokens_is_refused_in_one_line(tiny_run, capsys):
    assert main([f"run_dir={tiny_run}", "max_new_tokens=1000000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_new_tokens=1000000000" in err and "train.seq_len=32" in err, err


def test_a_checkpoint_with_nan_weights_is_refused_by_eval_export_and_generate(tiny_run, tmp_path, capsys):
    import shutil

    from nvfp4train.eval.__main__ import main as eval_main
    from nvfp4train.export import main as export_main
    from tests.conftest import poison_checkpoint

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (ckpt,) = (run / "checkpoints").glob("step_*")
    poison_checkpoint(ckpt, "model.blocks.0.mixer.A_log")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for command, args in [
        (eval_main, [f"run_dir={run}"]),
        (export_main, [f"run_dir={run}", f"out={tmp_path / 'export'}"]),
        (main, [f"run_dir={run}", "prompt=a"]),
    ]:
        assert command(args) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert str(ckpt) in err and "blocks.0.mixer.A_log holds NaN or inf" in err, err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # no eval.json, no export
    assert not (tmp_path / "export").exists()
