"""Hydra's own flags pass through the up-front override check, and a sweep writes nothing into the cwd; Hydra's
keys and flags that name code to run, read another config or move Hydra's files are refused in one line."""

import re
import subprocess
import sys

import pytest
import yaml

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


def test_help_says_what_cfg_job_prints_and_where_the_meanings_are():
    """--help once promised that `--cfg job` prints every key's meaning; it prints keys and values. What --help
    names instead must exist: every repository path it points to."""
    from pathlib import Path

    from nvfp4train.train.__main__ import usage

    text = usage()
    assert "--cfg job` prints every key with its value, without meanings" in text
    root = Path(__file__).resolve().parents[2]
    paths = re.findall(r"(?:nvfp4train|docs)/[\w/]+(?:\.\w+)?", text)
    assert "nvfp4train/precision/recipe.py" in paths and "docs/configuration.md" in paths
    assert [p for p in paths if not (root / p).exists()] == []


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


def _sweep(tmp_path, *args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "-m", *args],
        cwd=tmp_path,
        env=env or cli_env(TMPDIR=tmp_path / "tmp"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


TINY_RUN = ["train.max_steps=1", "train.seq_len=32", "train.global_batch_size=2", "train.eval_sequences=1"]


def test_each_job_of_a_sweep_trains_in_a_directory_of_its_own(tmp_path):
    proc = _sweep(tmp_path, "precision=bf16,fp8_tensorwise", "out_dir=sweep", *TINY_RUN, "train.progress=false")
    assert proc.returncode == 0, proc.stderr
    jobs = sorted(p.name for p in (tmp_path / "sweep").iterdir())
    assert jobs == ["0_precision=bf16", "1_precision=fp8_tensorwise"]
    for job in jobs:
        assert (tmp_path / "sweep" / job / "checkpoints" / "step_00000001").is_dir()
        config = yaml.safe_load((tmp_path / "sweep" / job / "config.yaml").read_text())
        assert config["precision"]["name"] == job.partition("=")[2]
    assert "sweep job 1 (precision=fp8_tensorwise): out_dir sweep/1_precision=fp8_tensorwise" in proc.stdout


def test_a_sweep_of_out_dir_with_another_key_is_refused_before_job_0(tmp_path):
    proc = _sweep(tmp_path, "seed=1,2", "out_dir=a,b", *TINY_RUN)
    line = _one_line_refusal(proc)
    assert line.startswith("error: out_dir: swept together with seed") and "DIR/<job number>" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "override, expected",
    [
        ("hydra/launcher=basic", "allowed launchers: hydra/launcher=submitit_slurm, hydra/launcher=submitit_local"),
        ("hydra.launcher.setup=[rm]", "hydra.launcher.setup=[rm]: not a settable key of the submitit launcher"),
        ("hydra.launcher.submitit_folder=/x", "not a settable key of the submitit launcher"),
        ("hydra.launcher._target_=os.system", "not a settable key of the submitit launcher"),
        ("hydra.launcher.additional_parameters={_target_:os.system}", "not a settable key of the submitit"),
        ("hydra.sweep.dir=runs/x", "'hydra.sweep.dir' is not settable"),
    ],
)
def test_only_the_submitit_launcher_and_its_plain_keys_are_settable(override, expected):
    check_overrides(["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"], launcher=True)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_overrides([override], launcher=True)
    with pytest.raises(ConfigError, match="is not settable"):  # an experiment file chooses no launcher
        check_overrides(["hydra/launcher=submitit_slurm"])


def test_a_launcher_key_without_the_launcher_is_refused_before_job_0(tmp_path):
    proc = _sweep(tmp_path, "hydra.launcher.partition=gpu", "seed=1,2", "out_dir=sweep", *TINY_RUN)
    line = _one_line_refusal(proc)
    assert line == (
        "error: hydra.launcher.partition: a key of the submitit launcher; choose it too: hydra/launcher=submitit_slurm"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_launcher_without_a_sweep_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "hydra/launcher=submitit_local", "out_dir=run"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "a launcher runs the jobs of a sweep; add -m" in _one_line_refusal(proc)
    assert list(tmp_path.iterdir()) == []


def test_a_submitit_local_sweep_trains_each_job(tmp_path):
    """Hydra's submitit launcher (pip install 'nvfp4train[slurm]') runs each job in a process of its own; its
    files go under out_dir/.submitit, the runs beside them."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = _sweep(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", "seed=1,2",
                  "out_dir=sweep", *TINY_RUN, "train.progress=false", timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = tmp_path / "sweep"
    assert {"0_seed=1", "1_seed=2", ".submitit", "multirun.yaml"} <= {p.name for p in sweep.iterdir()}
    for job in ("0_seed=1", "1_seed=2"):
        assert (sweep / job / "checkpoints" / "step_00000001").is_dir()


def test_shell_completion_is_hydras(tmp_path):
    """`-sc install=bash` prints Hydra's completion script and `-sc query=bash` answers it: neither runs a job."""
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "-sc", "install=bash"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and "hydra_bash_completion()" in proc.stdout, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "nvfp4train.train", "-sc", "query=bash"],
        cwd=tmp_path, env=cli_env(COMP_LINE="train prec", COMP_POINT="10"), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and "precision=" in proc.stdout.split(), proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []
