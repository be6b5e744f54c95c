"""Build hook: ship the top-level ``spec/`` and ``vectors/`` inside the package.

They stay top-level directories of the repository (one source of truth, no
copies in git); a wheel build copies them to ``refreplay/_data/`` where
``refreplay.resources`` looks first.  An sdist carries them as top-level
directories (MANIFEST.in), so a wheel built from it gets them the same way.
Editable installs read the checkout's directories and copy nothing.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA = ("spec", "vectors")


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for name in DATA:
            for src in sorted((ROOT / name).rglob("*")):
                if src.is_file() and "__pycache__" not in src.parts:
                    dst = Path(self.build_lib, "refreplay", "_data", name, src.relative_to(ROOT / name))
                    self.mkpath(str(dst.parent))
                    self.copy_file(str(src), str(dst))


setup(cmdclass={"build_py": BuildPyWithData})
