"""Build hook: the wheel carries libloaderclient.so, and the optional extension.

pyproject.toml holds the metadata; this file copies the C library into the package
when it is built, so that `pip install ./client/python` after `make` gives an environment
that needs nothing else. The library is taken from $LOADERCLIENT_LIB when set, else from
the repository's build tree (build/lib/libloaderclient.so, which `make` writes). With
LOADERCLIENT_BUNDLE=0 nothing is copied and the installed package finds the library on
the system path instead (after `make install`).

The extension loaderclient._speedups (loaderclient/_speedups.c: the per-batch steps in C)
is built when a C compiler, Python's headers (Debian: python3-dev) and numpy are there,
for Python 3.10 or later; it is optional: without it the install goes on and the package
runs its Python path.
"""
import os
import shutil
import sys

from setuptools import Extension, setup
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
    """The wheel holds native code: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return bool(self.ext_modules) or os.environ.get("LOADERCLIENT_BUNDLE", "1") != "0"


def extensions():
    if sys.version_info < (3, 10):   # the C API the extension uses
        return []
    try:
        import numpy
    except ImportError:   # no numpy's headers to build against: the Python path only
        return []
    src = [os.path.join("loaderclient", f) for f in ("_speedups.c", "_speedups_pages.c")]
    return [Extension("loaderclient._speedups", src, depends=[os.path.join("loaderclient", "_speedups.h")],
                      include_dirs=[numpy.get_include()], extra_compile_args=["-std=c11"], optional=True)]


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution, ext_modules=extensions())
