"""The one thing pyproject.toml cannot say: a ``.pth`` file at the top of the wheel, so kombu knows
the ``fsjobstore://`` URL without an import of ours (fsjobstore/contrib/_kombu_alias.py says how)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "fsjobstore-kombu.pth"


class BuildWithAlias(build_py):
    def run(self) -> None:
        super().run()
        with open(os.path.join("fsjobstore", "contrib", "_kombu_alias.py"), encoding="utf-8") as f:
            source = f.read()
        # One line: site.py runs a .pth line that starts with "import".
        line = f"import sys; exec({source!r})\n"
        with open(os.path.join(self.build_lib, PTH), "w", encoding="utf-8") as f:
            f.write(line)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithAlias})
