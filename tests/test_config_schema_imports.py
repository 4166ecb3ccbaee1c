"""The validator (`nvfp4train.config.schema`) sits in the config package, which imports the packages that use it:
each of those imports first in a fresh interpreter (no import cycle), and the package's names are the same objects
whichever module loaded first."""

import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env

# Modules below config that import the validator at top level, each the first import of a fresh interpreter.
FIRST_IMPORTS = [
    "nvfp4train.model.config",
    "nvfp4train.precision.recipe",
    "nvfp4train.precision.backends",
    "nvfp4train.data.config",
    "nvfp4train.optim",
    "nvfp4train.optim.schedules",
    "nvfp4train.parallel",
    "nvfp4train.config.run",
    "nvfp4train.train.resume_policy",
    "nvfp4train.config.composition",  # the modules of the exported functions, imported before the names are
    "nvfp4train.config.help_text",
]


@pytest.mark.parametrize("module", FIRST_IMPORTS)
def test_a_user_of_the_validator_imports_first(module):
    code = (
        f"import {module}\n"
        "import inspect\n"
        "from nvfp4train.config import ConfigError, RunConfig, compose, usage\n"
        "from nvfp4train.config.run import RunConfig as run_config\n"
        "from nvfp4train.config.schema import ConfigError as schema_error\n"
        "assert inspect.isfunction(compose) and inspect.isfunction(usage), (compose, usage)\n"
        "assert RunConfig is run_config and ConfigError is schema_error\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
