"""The layering is enforced by the build: proto/ (the wire) and client/ (libloaderclient,
loaderctl, the integration tests) are compiled with include paths that do not reach
daemon/, so including a daemon header there is a compile error, not a convention."""
import os
import re
import shutil
import subprocess

import pytest

import support


def _make_var(name):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", support.REPO,
                        "--eval=print-var: ; @echo $(%s)" % name, "print-var"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _compile(scratch, flags, header):
    src = scratch / "probe.c"
    src.write_text('#include "%s"\nint probe(void);\nint probe(void) { return 0; }\n' % header)
    return subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-fsyntax-only"] + flags + [str(src)],
                          capture_output=True, text=True, timeout=60, cwd=support.REPO)


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")
def test_wire_and_client_cannot_include_daemon_headers(scratch):
    wire = _make_var("INC_WIRE") + _make_var("PKG_CFLAGS")
    daemon = _make_var("INC_DAEMON") + _make_var("PKG_CFLAGS")
    for ok in ("proto.h", "ld_wire.h", "loaderclient.h", "proto_socket.h"):
        r = _compile(scratch, wire, ok)
        assert r.returncode == 0, (ok, r.stderr)
    for header in ("ring.h", "log.h", "stream.h", "config.h"):
        assert _compile(scratch, daemon, header).returncode == 0, header
        r = _compile(scratch, wire, header)
        assert r.returncode != 0 and "No such file" in r.stderr, (header, r.stderr)


def test_wire_header_needs_no_json():
    """ld_wire.h (constants, limits, ring layout) is usable without cJSON: it includes
    nothing but the C library and the error table."""
    text = open(os.path.join(support.REPO, "proto", "ld_wire.h")).read()
    includes = re.findall(r'#include [<"]([^>"]+)[>"]', text)
    assert set(includes) <= {"stddef.h", "stdint.h", "ld_error.h"}, includes
    for path in ("proto", "client"):
        for name in os.listdir(os.path.join(support.REPO, path)):
            if name.endswith((".c", ".h")):
                src = open(os.path.join(support.REPO, path, name)).read()
                for inc in re.findall(r'#include "([^"]+)"', src):
                    assert os.path.exists(os.path.join(support.REPO, "proto", inc)) or \
                        os.path.exists(os.path.join(support.REPO, "client", inc)), (path, name, inc)
