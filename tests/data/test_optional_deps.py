"""`datasets` (with pyarrow) and wandb are extras: the default run needs neither, and an input or option
that does names the extra to install in one line."""

import sys
from pathlib import Path

import pytest

from nvfp4train.config import WandbConfig
from nvfp4train.config.schema import ConfigError
from nvfp4train.data.inputs import iter_documents
from nvfp4train.train.metrics import MetricsLogger


def test_missing_extras_name_the_install(tmp_path, monkeypatch):
    for module in ("datasets", "pyarrow", "pyarrow.parquet", "wandb"):
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    (tmp_path / "docs.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^src: parquet input .* pip install 'nvfp4train\[datasets\]'$"):
        list(iter_documents(str(tmp_path / "docs.parquet"), key="src"))
    with pytest.raises(ValueError, match=r"^src: a \{hf: \.\.\.\} input needs .*nvfp4train\[datasets\]'$"):
        list(iter_documents({"hf": str(tmp_path)}, key="src"))
    with pytest.raises(ConfigError, match=r"train.wandb.enabled=true needs .*nvfp4train\[wandb\]'$"):
        MetricsLogger(tmp_path, enabled=True).start_wandb(WandbConfig(enabled=True), {}, "e", tmp_path, None)


def test_core_dependencies_leave_them_out():
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "datasets" not in core and "wandb" not in core
    assert {"datasets>=2.18", "wandb"} <= set(project["optional-dependencies"]["test"])
