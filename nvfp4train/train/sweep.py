"""A Hydra `-m` sweep of training runs: every job gets its own run directory under `out_dir`.

`python -m nvfp4train.train -m precision=bf16,nvfp4 out_dir=runs/sweep` trains into `runs/sweep/0_precision=bf16`
and `runs/sweep/1_precision=nvfp4`: `<job number>_<the swept keys of that job>`, Hydra's own
`hydra.job.override_dirname` restricted to the keys that take several values. The same command again resumes
each job from its own directory. A sweep over `out_dir` alone (`out_dir=runs/a,runs/b`), or an out_dir that
interpolates a swept key (`out_dir=runs/s${seed}`), uses those directories as given; `out_dir` swept together
with another key would put several jobs in one directory, so it is refused before job 0 starts. With
`hydra/launcher=submitit_slurm` (or `submitit_local`) the jobs are submitted by Hydra's submitit launcher,
whose batch files and logs go to `out_dir/.submitit/` (on the cluster's shared file system, where the
compute nodes read them), and Hydra's `multirun.yaml` to `out_dir/`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from nvfp4train.config.schema import ConfigError

SUBMITIT_PLUGIN = "hydra_plugins.hydra_submitit_launcher"


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sweep_hydra_overrides(overrides: list[str], default_out_dir: str) -> list[str]:
    """The Hydra overrides a sweep of these (already checked) command-line overrides adds to the command line:
    `hydra.job.override_dirname` names only the swept keys, and a submitit launcher writes under `out_dir`.
    One ConfigError line, before any job, for a sweep whose jobs would share a directory or a launcher that is
    not installed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    swept = [o.key_or_group for o in parsed if o.is_sweep_override()]
    if "out_dir" in swept and len(swept) > 1:
        others = ", ".join(k for k in swept if k != "out_dir")
        raise ConfigError(
            f"out_dir: swept together with {others}, several jobs would train into one directory; give one "
            f"out_dir=DIR and each job trains into DIR/<job number>_<its swept keys>"
        )
    task = [o for o in parsed if not o.key_or_group.startswith(("hydra.", "hydra/"))]
    fixed = sorted({o.key_or_group for o in task if not o.is_sweep_override()})
    extra = [f"hydra.job.config.override_dirname.exclude_keys=[{','.join(_quoted(k) for k in fixed)}]"]
    launcher = next((o.get_value_element_as_str() for o in parsed if o.key_or_group == "hydra/launcher"), None)
    keys = [o.key_or_group for o in parsed if o.key_or_group.startswith("hydra.launcher.")]
    if keys and launcher is None:  # Hydra's basic launcher has none of these keys
        raise ConfigError(f"{keys[0]}: a key of the submitit launcher; choose it too: hydra/launcher=submitit_slurm")
    if launcher is not None:
        if not _has_plugin():
            raise ConfigError(
                f"hydra/launcher={launcher}: needs Hydra's submitit launcher: pip install 'nvfp4train[slurm]' "
                "(hydra-submitit-launcher)"
            )
        out_dir = next((o.get_value_element_as_str() for o in parsed if o.key_or_group == "out_dir"), None)
        base = Path(out_dir or default_out_dir).expanduser()
        extra.append(f"hydra.sweep.dir={_quoted(str(base if base.is_absolute() else Path.cwd() / base))}")
    return extra


def _has_plugin() -> bool:
    try:
        return importlib.util.find_spec(SUBMITIT_PLUGIN) is not None
    except ModuleNotFoundError:
        return False


def job_dir_name(num: int, override_dirname: str) -> str:
    """`<num>_<key=value,...>` with every character a path could misread (`/`, spaces, quotes) as `_`."""
    name = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", override_dirname).strip("_.")[:120]
    return f"{num}_{name}" if name else str(num)


def place_sweep_job(cfg) -> str | None:
    """In a job of a `-m` sweep, set `cfg.out_dir` to the job's own directory and return a line saying so;
    None (cfg untouched) outside a sweep or in a sweep over out_dir alone."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    excluded = set(hc.job.config.override_dirname.exclude_keys or ())
    task = dict(t.lstrip("+~").partition("=")[::2] for t in hc.overrides.task)
    swept = [k for k in task if k not in excluded]
    if swept == ["out_dir"] or "${" in task.get("out_dir", ""):  # the user's own per-job directories
        return f"sweep job {hc.job.num}: out_dir {cfg.out_dir}"
    out_dir = str(Path(str(cfg.out_dir)) / job_dir_name(hc.job.num, hc.job.override_dirname))
    cfg.out_dir = out_dir
    return f"sweep job {hc.job.num} ({hc.job.override_dirname or 'no swept keys'}): out_dir {out_dir}"
