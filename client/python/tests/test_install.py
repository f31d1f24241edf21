"""Installing: `make install` into a staging DESTDIR gives a tree a C trainer builds
against with pkg-config alone, and `pip install ./client/python` gives a fresh virtual
environment a working package that carries its library.

Both run the repository's Makefile on the default build directory (build/), which
`make test` has built just before the Python tests; run alone, `make install` builds
what is missing first.
"""
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

import support

PREFIX = "/opt/loaderd-test"   # not the default: PREFIX must reach every path


def _version():
    with open(os.path.join(support.REPO, "VERSION")) as f:
        return f.read().strip()


def _env(**kw):
    """The environment without the outer make's jobserver (this make is a separate one)."""
    e = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    e.update(kw)
    return e


def _run(cmd, timeout=600, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(cmd), r.returncode, r.stdout[-4000:],
                                                           r.stderr[-4000:])
    return r


@pytest.fixture(scope="module")
def staged():
    if not shutil.which("pkg-config") or not shutil.which("cc"):
        pytest.skip("pkg-config or cc not installed")
    d = support.short_tmpdir("lc-install.")
    _run(["make", "--no-print-directory", "-C", support.REPO, "install", "DESTDIR=" + d, "PREFIX=" + PREFIX],
         env=_env())
    yield d
    support.rmtree(d)


def test_installed_files(staged):
    v = _version()
    major = v.split(".")[0]
    root = staged + PREFIX
    found = set()
    for dirpath, dirnames, filenames in os.walk(staged):
        for n in filenames:
            found.add(os.path.relpath(os.path.join(dirpath, n), staged))
    want = {p.lstrip("/") for p in [
        PREFIX + "/bin/loaderd", PREFIX + "/bin/loaderctl",
        PREFIX + "/lib/libloaderclient.so." + v, PREFIX + "/lib/libloaderclient.so." + major,
        PREFIX + "/lib/libloaderclient.so", PREFIX + "/lib/libloaderclient.a",
        PREFIX + "/include/loaderclient.h", PREFIX + "/include/loaderclient_errors.h",
        PREFIX + "/lib/pkgconfig/loaderclient.pc",
        PREFIX + "/lib/systemd/system/loaderd.service", PREFIX + "/lib/systemd/system/loaderd.socket",
        PREFIX + "/lib/sysusers.d/loaderd.conf", PREFIX + "/lib/tmpfiles.d/loaderd.conf",
        PREFIX + "/share/doc/loaderd/examples/loaderd.yaml", PREFIX + "/share/doc/loaderd/README.md",
        PREFIX + "/share/loaderd/systemd/loaderd-gpu.conf"]}
    assert found == want
    lib = os.path.join(root, "lib")
    # The -l link and the soname link, relative, down to the one real file.
    assert os.readlink(os.path.join(lib, "libloaderclient.so")) == "libloaderclient.so." + major
    assert os.readlink(os.path.join(lib, "libloaderclient.so." + major)) == "libloaderclient.so." + v
    assert not os.path.islink(os.path.join(lib, "libloaderclient.so." + v))
    r = _run(["readelf", "-d", os.path.join(lib, "libloaderclient.so." + v)])
    assert "Library soname: [libloaderclient.so.%s]" % major in r.stdout
    for b in ("loaderd", "loaderctl"):
        mode = os.stat(os.path.join(root, "bin", b)).st_mode
        assert mode & stat.S_IXUSR and mode & stat.S_IXOTH
        out = _run([os.path.join(root, "bin", b), "--version"]).stdout
        assert out.strip() == "%s %s" % (b, v)
    pc = open(os.path.join(lib, "pkgconfig", "loaderclient.pc")).read()
    assert "\nVersion: %s\n" % v in pc and "prefix=%s\n" % PREFIX in pc
    unit = open(os.path.join(root, "lib", "systemd", "system", "loaderd.service")).read()
    assert "ExecStart=%s/bin/loaderd --config /etc/loaderd/loaderd.yaml" % PREFIX in unit
    assert "/usr/local/" not in unit.split("[Unit]", 1)[1]


TRAINER = textwrap.dedent(r"""
    #include <loaderclient.h>
    #include <stdio.h>
    #include <string.h>

    int main(int argc, char **argv)
    {
        lc_stream_options o;
        lc_stream_options_init(&o);
        lc_client *c = NULL;
        char err[256] = "";
        int rc = lc_connect(argv[1], 2000, "install-test", &c, err, sizeof err);
        printf("%s %d %lld %zu\n", lc_version(), lc_version_number(), (long long)lc_limit("batch_size_max"),
               o.struct_size == sizeof o ? (size_t)1 : (size_t)0);
        printf("%d %s %s\n", rc, lc_error_name(rc), lc_error_name(LC_ENODATASET));
        return c == NULL && rc == LC_ENOENT ? 0 : 1;
    }
""")


@pytest.mark.parametrize("static", [False, True])
def test_trainer_builds_with_pkg_config(staged, scratch, static):
    """A trainer's build line is `cc app.c $(pkg-config --cflags --libs loaderclient)`; the
    installed tree is found through PKG_CONFIG_PATH, and PKG_CONFIG_SYSROOT_DIR maps its
    paths into the staging directory."""
    src = scratch / "trainer.c"
    src.write_text(TRAINER)
    env = _env(PKG_CONFIG_PATH=staged + PREFIX + "/lib/pkgconfig", PKG_CONFIG_SYSROOT_DIR=staged)
    args = ["pkg-config", "--cflags", "--libs"] + (["--static"] if static else []) + ["loaderclient"]
    flags = _run(args, env=env).stdout.split()
    assert "-I%s%s/include" % (staged, PREFIX) in flags and "-lloaderclient" in flags
    exe = str(scratch / "trainer")
    cmd = ["cc", "-std=c11", "-Wall", "-Werror", "-o", exe, str(src)]
    for f in flags:   # static: the .a in place of the .so, the rest (cJSON, libm) as pkg-config says
        cmd += ["-Wl,-Bstatic", f, "-Wl,-Bdynamic"] if static and f == "-lloaderclient" else [f]
    _run(cmd, env=env)
    needed = _run(["readelf", "-d", exe]).stdout
    assert ("libloaderclient.so" in needed) != static
    if not static:
        assert "Shared library: [libloaderclient.so.%s]" % _version().split(".")[0] in needed
    r = subprocess.run([exe, str(scratch / "no.sock")], capture_output=True, text=True, timeout=30,
                       env=_env(LD_LIBRARY_PATH=staged + PREFIX + "/lib"))
    assert r.returncode == 0, r.stdout + r.stderr
    v = _version()
    maj, mnr, pat = (int(x) for x in v.split("."))
    line1, line2 = r.stdout.splitlines()
    assert line1 == "%s %d 65536 1" % (v, maj * 10000 + mnr * 100 + pat)
    assert line2 == "-2 not_found no_such_dataset"


def test_pip_install_in_fresh_venv(daemon, scratch):
    """`pip install ./client/python` after `make`, into a new virtual environment: the
    package carries libloaderclient.so, reports the one version, ships py.typed, and reads
    batches from a real loaderd without any path or environment help."""
    venv = str(scratch / "venv")
    _run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    py = os.path.join(venv, "bin", "python")
    env = _env()
    env.pop("LOADERCLIENT_LIB", None)
    env.pop("PYTHONPATH", None)
    lib = os.environ.get("LOADERCLIENT_LIB")
    if lib:   # the library under test goes into the wheel
        env["LOADERCLIENT_LIB"] = os.path.abspath(lib)
    r = _run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", "-q",
              os.path.join(support.REPO, "client", "python")], env=env, timeout=300)
    env.pop("LOADERCLIENT_LIB", None)
    code = textwrap.dedent("""
        import os, sys, loaderclient
        pkg = os.path.dirname(loaderclient.__file__)
        assert pkg.startswith(sys.prefix), pkg
        assert loaderclient.library_path == os.path.join(pkg, "libloaderclient.so"), loaderclient.library_path
        assert os.path.exists(os.path.join(pkg, "py.typed"))
        # pip built the extension into the package (Python's headers are there: deps.sh)
        assert loaderclient.speedups_path is not None, loaderclient.speedups_note
        assert os.path.dirname(loaderclient.speedups_path) == pkg, loaderclient.speedups_path
        print(loaderclient.__version__, loaderclient.library_version)
        with loaderclient.Client(sys.argv[1], timeout=10) as c:
            with c.open("rec", batch_size=100, epochs=1, shuffle=False) as s:
                print(sum(b.rows for b in s))
    """)
    r = _run([py, "-c", code, daemon.socket], env=env, cwd=str(scratch), timeout=120)
    v = _version()
    assert r.stdout.split() == [v, v, "1000"]


def test_library_exports_exactly_the_public_api(staged):
    """The shared library's dynamic symbols are the LC_EXPORT functions of loaderclient.h,
    no more (the wire codec and the daemon's helpers stay internal, so they can change
    without a soname bump) and no fewer."""
    import re
    header = open(os.path.join(support.REPO, "client", "loaderclient.h")).read()
    declared = set(re.findall(r"LC_EXPORT [^;(]*?\b(lc_\w+)\(", header))
    assert len(declared) > 25
    so = os.path.join(staged + PREFIX, "lib", "libloaderclient.so." + _version())
    out = _run(["nm", "-D", "--defined-only", so]).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip() and line.split()[1] in "TtWwDdBbRr"}
    exported = {s for s in exported if not s.startswith("_")}
    assert exported == declared


def test_uninstall_removes_what_install_wrote(scratch):
    d = str(scratch / "stage")
    _run(["make", "--no-print-directory", "-C", support.REPO, "install", "DESTDIR=" + d, "PREFIX=" + PREFIX],
         env=_env())
    _run(["make", "--no-print-directory", "-C", support.REPO, "uninstall", "DESTDIR=" + d, "PREFIX=" + PREFIX],
         env=_env())
    left = [os.path.join(dp, n) for dp, dn, fn in os.walk(d) for n in fn]
    assert left == []


def test_help_is_complete(staged):
    """--help is the manual: every option the programs parse and every environment
    variable the daemon, the library and loaderctl read appear in it."""
    import re
    root = staged + PREFIX

    def src(*parts):
        return open(os.path.join(support.REPO, *parts)).read()

    env_vars = set()
    for d in ("daemon", "proto", "client", "tools"):
        for n in os.listdir(os.path.join(support.REPO, d)):
            if n.endswith(".c"):
                env_vars |= set(re.findall(r'getenv\("([A-Z_]+)"\)', src(d, n)))
    assert {"LOADERD_SOCKET", "LOADERD_UID"} <= env_vars

    daemon_opts = set(re.findall(r'\{"([a-z-]+)", (?:no|required|optional)_argument', src("daemon", "main.c")))
    assert {"config", "check", "help", "version"} <= daemon_opts
    out = _run([os.path.join(root, "bin", "loaderd"), "--help"]).stdout
    for o in daemon_opts:
        assert "--" + o in out, "loaderd --help lacks --" + o
    assert "LOADERD_SOCKET" in out and "exit status" in out
    daemon_help = out

    ctl_srcs = [n for n in os.listdir(os.path.join(support.REPO, "tools"))
                if n.startswith("loaderctl") and n.endswith(".c")]
    assert {"loaderctl.c", "loaderctl_read.c"} <= set(ctl_srcs)
    ctl_opts = set()
    for n in ctl_srcs:
        ctl_opts |= set(re.findall(r'"(--[a-z][a-z-]*)', src("tools", n)))
    assert {"--batch-size", "--socket", "--daemon-uid"} <= ctl_opts
    ctl = os.path.join(root, "bin", "loaderctl")
    out = _run([ctl, "--help"]).stdout
    for cmd in ("read", "cache", "status", "datasets", "streams"):
        assert "\n  " + cmd in out, cmd
        r = subprocess.run([ctl, cmd, "--help"], capture_output=True, text=True, timeout=30)
        out += r.stdout
    for o in ctl_opts:
        assert o in out, "loaderctl --help lacks " + o
    for v in env_vars - {"XDG_RUNTIME_DIR"}:   # XDG_RUNTIME_DIR is named in LOADERD_SOCKET's line
        assert v in out or v in daemon_help, "neither loaderctl --help nor loaderd --help names " + v
    assert "XDG_RUNTIME_DIR" in out
