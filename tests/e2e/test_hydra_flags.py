"""Hydra's own flags pass through the up-front override check, and a sweep writes nothing into the cwd; Hydra's
keys and flags that name code to run, read another config or move Hydra's files are refused in one line."""

import re
import subprocess
import sys

import pytest

from nvfp4train.config import ConfigError, check_overrides
from tests.conftest import cli_env


def test_cfg_job_prints_the_composed_config(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "--cfg", "job", "precision=nvfp4"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "name: nvfp4" in proc.stdout and "micro_batch_size: null" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_multirun_leaves_no_multirun_yaml_in_the_cwd(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvfp4train.train",
            "-m",
            "seed=1,2",
            f"out_dir={out}/s${{seed}}",
            "train.max_steps=1",
            "train.seq_len=32",
            "train.global_batch_size=2",
            "train.eval_sequences=1",
            "train.progress=false",
        ],
        cwd=tmp_path,
        env=cli_env(TMPDIR=tmp_path / "tmp"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tmp"]
    assert sorted(p.name for p in out.iterdir()) == ["s1", "s2"]


# A payload that Hydra would instantiate and so run: open(MARKER, "w") creates the marker file.
def _payload(marker) -> list[str]:
    return [
        "+hydra.callbacks.x._target_=builtins.open",
        f"+hydra.callbacks.x.file={marker}",
        "+hydra.callbacks.x.mode=w",
    ]


def _one_line_refusal(proc) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["train", "eval", "export", "generate", "summary"])
def test_a_hydra_callback_is_refused_and_runs_nothing(tmp_path, command):
    marker = tmp_path / "marker"
    args = [f"out_dir={tmp_path / 'run'}", "train.max_steps=1"] if command == "train" else []
    args += [f"run_dir={tmp_path / 'run'}"] if command in ("eval", "export", "generate") else []
    proc = subprocess.run(
        [sys.executable, "-m", f"nvfp4train.{command}", *args, *_payload(marker)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = _one_line_refusal(proc)
    assert "hydra.callbacks.x" in line and "allowed: hydra.verbose" in line, line
    assert not marker.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--config-dir", "elsewhere"], "--config-dir/-cd: not supported"),
        (["-cp", "elsewhere"], "--config-path/-cp: not supported"),
        (["--experimental-rerun", "config.pickle"], "--experimental-rerun: not supported"),
        (["hydra.output_subdir=.hydra"], "'hydra.output_subdir' is not settable"),
    ],
)
def test_hydra_flags_that_read_other_files_or_move_hydras_are_refused(tmp_path, flags, expected):
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", f"out_dir={tmp_path / 'run'}", *flags],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert expected in _one_line_refusal(proc)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "override, expected",
    [
        ("hydra.run.dir=runs/x", "'hydra.run.dir' is not settable"),
        ("hydra.sweep.dir=runs/x", "'hydra.sweep.dir' is not settable"),
        ("hydra.job.chdir=true", "'hydra.job.chdir' is not settable"),
        ("hydra/launcher=basic", "'hydra/launcher' is not settable"),
        ("+hydra.verbose=true", "'hydra.verbose' is not settable"),
        ("model@hydra.callbacks=hybrid_tiny", "'model@hydra.callbacks' is not settable"),
        ("data.sources._target_=os.system", "'_target_' is a Hydra/OmegaConf special key"),
        ("data.sources.own={_target_:os.system}", "'_target_' is a Hydra/OmegaConf special key"),
        ("out_dir=${eval:1}", "the resolver 'eval' is not allowed"),
    ],
)
def test_overrides_that_name_code_or_move_hydras_files_are_refused(override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_overrides([override])


def test_an_experiment_file_may_call_no_resolver():
    check_overrides(["out_dir=runs/${now:%H}", "experiment=${oc.env:USER,me}"])  # the command line may
    with pytest.raises(ConfigError, match=r"the resolver 'oc.env' is not allowed; allowed interpolations: \$\{KEY\}$"):
        check_overrides(["experiment=${oc.env:HF_TOKEN}"], resolvers=())


def test_no_resolver_that_runs_code_is_registered():
    """The resolvers an interpolation can reach once every command is imported: OmegaConf's and Hydra's own,
    none that evaluates its argument (a custom `eval` resolver would run code from any config)."""
    from omegaconf.basecontainer import BaseContainer

    import nvfp4train.eval.__main__  # noqa: F401
    import nvfp4train.generate  # noqa: F401
    import nvfp4train.reproduce.__main__  # noqa: F401
    import nvfp4train.train.__main__  # noqa: F401
    import nvfp4train.train.loop  # noqa: F401
    from nvfp4train.config import compose

    compose("train", [])
    builtin = {"oc.create", "oc.decode", "oc.deprecated", "oc.dict.keys", "oc.dict.values", "oc.env", "oc.select"}
    assert set(BaseContainer._resolvers) <= builtin | {"hydra", "now", "python_version"}
