"""configs/ stays at the repository root; a built wheel carries a copy as nvfp4train/configs, which
nvfp4train.train.config.CONFIG_DIR finds when there is no source checkout around the package."""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install reads configs/ where it is
            self.copy_tree(str(Path(__file__).parent / "configs"), str(Path(self.build_lib) / "nvfp4train" / "configs"))


setup(cmdclass={"build_py": BuildPyWithConfigs})
