"""One config mechanism: every section is a dataclass checked by nvfp4train.config.schema, defaults live in the
dataclasses, presets state only what differs, and a wheel install finds the configs."""

import ast
import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvfp4train.config import (
    CONFIG_DIR,
    SECTIONS,
    RunConfig,
    TrainConfig,
    WandbConfig,
    check_overrides,
    load_preset,
)
from nvfp4train.config.schema import ConfigError, parse
from nvfp4train.data.config import DataConfig, InputHashes, PhaseSpec, SourceConfig, parse_data_config
from nvfp4train.model.config import ModelConfig
from nvfp4train.optim import OptimConfig, ScheduleConfig
from nvfp4train.precision.recipe import PrecisionPolicy, SwitchConfig

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = [
    RunConfig,
    TrainConfig,
    WandbConfig,
    OptimConfig,
    ScheduleConfig,
    ModelConfig,
    PrecisionPolicy,
    SwitchConfig,
    DataConfig,
    SourceConfig,
    InputHashes,
    PhaseSpec,
]


@pytest.mark.parametrize("cls", SCHEMAS, ids=lambda c: c.__name__)
def test_every_field_has_a_docstring(cls):
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    documented = {
        stmt.target.id
        for stmt, after in zip(body, body[1:] + [None])
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    assert {f.name for f in dataclasses.fields(cls)} == documented


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"compile": 1}, ["train.compile=1", "allowed auto, true, false"]),
        ({"max_steps": True}, ["train.max_steps", "expected int"]),
        ({"max_steps": "5"}, ["train.max_steps", "expected int"]),
        ({"spike_factor": "big"}, ["train.spike_factor", "expected float"]),
        ({"spike_factor": 1}, ["train.spike_factor=1.0", "must be > 1"]),
        ({"device": "tpu"}, ["train.device='tpu'", "auto, cpu, cuda"]),
        ({"wandb": {"mode": "loud"}}, ["train.wandb.mode='loud'", "online"]),
        ({"wandb": {"projekt": "x"}}, ["train.wandb: unknown key 'projekt'", "project"]),
        ({"zero_stage": 3}, ["train.zero_stage=3", "[1, 2]"]),
    ],
)
def test_one_validator_one_line(raw, words):
    with pytest.raises(ConfigError) as e:
        parse(TrainConfig, raw, "train")
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_types_are_normalized():
    assert parse(TrainConfig, {"spike_factor": "4e0", "progress": False}, "train").progress == "false"
    optim = parse(OptimConfig, {"lr": 1, "betas": [0.8, 0.9], "schedule": {"name": "cosine"}}, "optim")
    assert optim.lr == 1.0 and isinstance(optim.lr, float) and optim.betas == (0.8, 0.9)
    assert optim.schedule == ScheduleConfig(name="cosine")
    with pytest.raises(ConfigError, match=r"optim.betas\[1\]: expected float"):
        parse(OptimConfig, {"betas": [0.9, None]}, "optim")


@pytest.mark.parametrize(
    "override, from_file",
    [
        ("train.max_stepz=5", lambda: parse(TrainConfig, {"max_stepz": 5}, "train")),
        ("optim.schedule.decay=2", lambda: OptimConfig.from_dict({"schedule": {"decay": 2}})),
        ("precision.switch.at=0.8", lambda: PrecisionPolicy.from_dict({"switch": {"at": 0.8}})),
        ("model.n_layers=4", lambda: ModelConfig.from_dict({"n_layers": 4})),
        (
            "data.sources.code.trian=x",
            lambda: parse_data_config({"tokenizer": "bpe8k", "sources": {"code": {"trian": "x"}}}),
        ),
    ],
)
def test_an_override_gets_the_message_a_config_file_would(override, from_file):
    with pytest.raises(ConfigError) as from_override:
        check_overrides([override])
    with pytest.raises(ConfigError) as from_yaml:
        from_file()
    assert str(from_override.value) == str(from_yaml.value)


def test_group_options_and_sweeps_are_checked():
    check_overrides(["precision=bf16,nvfp4", "train.max_steps=1,2", "hydra.verbose=true", "~train.wandb"])
    with pytest.raises(ConfigError, match="precision=nvfp5: no such precision config; allowed: bf16,"):
        check_overrides(["precision=bf16,nvfp5"])


def test_defaults_are_stated_once():
    """A preset states only what differs from the dataclass defaults (or, for an ablation, from nvfp4)."""
    for group in ("precision", "data"):
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            raw = yaml.safe_load(path.read_text())
            if "defaults" in raw:
                continue
            defaults = {f.name: f.default for f in dataclasses.fields(SECTIONS[group])}
            same = [k for k, v in raw.items() if k in defaults and defaults[k] == v]
            assert not same, f"{path.name} restates defaults: {same}"
    assert not (CONFIG_DIR / "train").exists() and not (CONFIG_DIR / "optim").exists()


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "precision").glob("nvfp4_*.yaml")), ids=lambda p: p.stem)
def test_ablation_is_nvfp4_plus_its_knob(path):
    raw = yaml.safe_load(path.read_text())
    assert raw.pop("defaults") == ["nvfp4"] and raw.pop("name") == path.stem
    base, ablation = load_preset("precision", "nvfp4"), load_preset("precision", path.stem)
    changed = {k for k in base if base[k] != ablation[k]} - {"name"}
    assert changed == {k for k in raw if base[k] != raw[k]} and set(raw) <= set(base) and changed


def test_cfg_job_prints_the_composed_config():
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "--cfg", "job", "precision=nvfp4_no_sr"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["precision"]["sr"] == "none" and cfg["precision"]["rht"] == "wgrad"
    assert cfg["train"]["max_steps"] == TrainConfig().max_steps and cfg["model"]["name"] == "hybrid_tiny"


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """`pip install .` (no -e) of a copy of the source tree into a target directory, then the copy deleted:
    nothing of the source tree is left to fall back on."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in (
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "README.md",
        "nvfp4train",
        "configs",
        "data/bundled",
        "data/tokenizer/bpe8k.json",
        "data/README.md",
    ):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    target = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(src)
    return target


def test_non_editable_install_finds_its_configs(installed_wheel, tmp_path):
    """`pip install .` (no -e): the wheel carries configs/, and the CLIs run from anywhere."""
    target = installed_wheel
    env = {**os.environ, "PYTHONPATH": str(target)}
    script = (
        "import sys, nvfp4train.summary as s, nvfp4train.config as c; print(c.CONFIG_DIR); "
        "sys.exit(s.main(['model=hybrid_tiny']))"
    )
    summary = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert Path(lines[0]) == target / "nvfp4train" / "configs"
    assert '"params": 2776240' in lines[-1]
    job = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "--cfg", "job", "precision=nvfp4_no_rht"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stderr
    assert yaml.safe_load(job.stdout)["precision"]["rht"] == "none"
    # eval and export compose their configs from the same copy
    script = (
        "from nvfp4train.config import compose; print(compose('eval', ['run_dir=r', 'max_items=3'])); "
        "print(compose('export', ['run_dir=r']))"
    )
    composed = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert composed.returncode == 0, composed.stderr
    assert "'max_items': 3" in composed.stdout.splitlines()[0] and "'run_dir': 'r'" in composed.stdout.splitlines()[1]


@pytest.mark.slow  # ~20 s: tokenizes the whole bundled corpus into a fresh cache
def test_non_editable_install_trains_on_its_shipped_data(installed_wheel, tmp_path):
    """The README's first command from the wheel, in an empty working directory: the default run reads the
    corpus and tokenizer the wheel ships, builds its token cache under $XDG_CACHE_HOME/nvfp4train, and
    writes nothing into the install (nor the working directory)."""

    def snapshot(root):
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}

    target, cwd, xdg, out = installed_wheel, tmp_path / "cwd", tmp_path / "xdg", tmp_path / "run"
    cwd.mkdir()
    assert (target / "nvfp4train" / "_shipped" / "data" / "README.md").is_file()  # the licences travel with the data
    before = snapshot(target)
    env = {
        **os.environ,
        "PYTHONPATH": str(target),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(xdg),
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            f"out_dir={out}",
            "train.max_steps=2",
            "train.progress=false",
            "train.eval_sequences=2",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    manifests = sorted(xdg.glob("nvfp4train/data/cache/*/*/*/manifest.json"))
    assert sorted(f"{m.parent.parent.name.rsplit('-', 1)[0]}/{m.parent.name}" for m in manifests) == sorted(
        f"{source}/{split}" for source in ("code", "encyclopedic", "literature") for split in ("train", "val")
    )
    assert snapshot(target) == before
    assert not any(cwd.iterdir())
    # a relative path the wheel does not ship is the working directory's, and a missing one says so
    bad = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", f"out_dir={out}2", "data.tokenizer=tok/nope.json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and f"tokenizer file not found: {cwd / 'tok/nope.json'}" in bad.stderr, bad.stderr


def test_non_editable_install_knows_no_commit(installed_wheel, tmp_path):
    """An install inside a git checkout (a venv in a clone) is not that checkout: its commit is "unknown"."""
    git = ["git", "-C", str(installed_wheel.parent), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "not the wheel's source"], check=True, timeout=60)
    proc = subprocess.run(
        [sys.executable, "-c", "from nvfp4train.data.paths import git_commit; print(git_commit())"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed_wheel)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "unknown", proc.stderr


def test_multirun_registers_the_defaults_too(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            "-m",
            "train.max_steps=1",
            f"out_dir={tmp_path}",
            "train.progress=false",
            "train.eval_sequences=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "done: step 1" in proc.stdout
