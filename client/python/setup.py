"""Build hook: the wheel carries libloaderclient.so.

pyproject.toml holds the metadata; this file only copies the C library into the package
when it is built, so that `pip install ./client/python` after `make` gives an environment
that needs nothing else. The library is taken from $LOADERCLIENT_LIB when set, else from
the repository's build tree (build/lib/libloaderclient.so, which `make` writes). With
LOADERCLIENT_BUNDLE=0 nothing is copied and the installed package finds the library on
the system path instead (after `make install`).
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "libloaderclient.so"


def library_source():
    env = os.environ.get("LOADERCLIENT_LIB")
    if env:
        return env
    return os.path.normpath(os.path.join(HERE, "..", "..", "build", "lib", NAME))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        if os.environ.get("LOADERCLIENT_BUNDLE", "1") == "0":
            return
        src = library_source()
        if not os.path.exists(src):
            raise SystemExit("loaderclient: %s not found. Run `make` at the repository root first, set "
                             "LOADERCLIENT_LIB to a built libloaderclient.so, or set LOADERCLIENT_BUNDLE=0 to "
                             "use the system's (make install)." % src)
        dst = os.path.join(self.build_lib, "loaderclient", NAME)
        shutil.copyfile(os.path.realpath(src), dst)  # the file itself, not the link
        os.chmod(dst, 0o755)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return os.environ.get("LOADERCLIENT_BUNDLE", "1") != "0"


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
