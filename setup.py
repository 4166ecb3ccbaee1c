"""configs/ and data/ stay at the repository root; a built wheel carries copies of what the default run
reads: configs/ as nvfp4train/configs (nvfp4train.config.CONFIG_DIR), and the bundled corpus,
the bpe8k tokenizer and data/README.md (their sources and licences) under nvfp4train/_shipped/, laid out
as in the repository (nvfp4train.data.paths.resolve_path). Locally built data (data/cache, data/corpora)
stays out."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
SHIPPED_DATA = ("data/bundled", "data/tokenizer/bpe8k.json", "data/README.md")


class BuildPyWithConfigsAndData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads configs/ and data/ where they are
            return
        package = Path(self.build_lib) / "nvfp4train"
        self.copy_tree(str(ROOT / "configs"), str(package / "configs"))
        for name in SHIPPED_DATA:
            copy = self.copy_tree if (ROOT / name).is_dir() else self.copy_file
            self.mkpath(str((package / "_shipped" / name).parent))
            copy(str(ROOT / name), str(package / "_shipped" / name))


setup(cmdclass={"build_py": BuildPyWithConfigsAndData})
