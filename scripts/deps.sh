#!/usr/bin/env bash
# Checks that the build's libraries and tools are present. Missing ones are installed
# with apt-get when we run as root; otherwise the apt line is printed and we fail.
# Usage: scripts/deps.sh [build|test|bench|peers|fuzz]
set -euo pipefail
what=${1:-build}

pkgs=()
need_pc() { pkg-config --exists "$1" 2>/dev/null || pkgs+=("$2"); }
need_bin() { command -v "$1" >/dev/null 2>&1 || pkgs+=("$2"); }

need_bin cc gcc
need_bin make make
need_bin pkg-config pkg-config
if command -v pkg-config >/dev/null 2>&1; then
  need_pc libuv libuv1-dev
  need_pc libcjson libcjson-dev
  need_pc yaml-0.1 libyaml-dev
  need_pc libsystemd libsystemd-dev
  need_pc libxxhash libxxhash-dev
  need_pc libturbojpeg libturbojpeg0-dev
  need_pc libjpeg libjpeg62-turbo-dev
  need_pc libpng libpng-dev
  need_pc sqlite3 libsqlite3-dev
  need_pc libpq libpq-dev
  need_pc libcurl libcurl4-openssl-dev
  need_pc libcrypto libssl-dev
  need_pc libxml-2.0 libxml2-dev
  need_pc liburing liburing-dev
  if [ "$what" != build ]; then need_pc cmocka libcmocka-dev; fi
else
  pkgs+=(libuv1-dev libcjson-dev libyaml-dev libsystemd-dev libxxhash-dev libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev libsqlite3-dev libpq-dev libcurl4-openssl-dev libssl-dev libxml2-dev liburing-dev libcmocka-dev)
fi
# The fuzzers (make fuzz, and briefly in make test): clang with libFuzzer's runtime and
# llvm-symbolizer for readable sanitizer reports.
if [ "$what" = test ] || [ "$what" = fuzz ]; then
  need_bin clang clang
  need_bin llvm-symbolizer llvm
  if command -v clang >/dev/null 2>&1; then
    fuzzer_rt=$(clang -print-file-name=libclang_rt.fuzzer-$(uname -m).a 2>/dev/null || true)
    if [ ! -f "$fuzzer_rt" ]; then
      v=$(clang -dumpversion 2>/dev/null | cut -d. -f1)
      pkgs+=("libclang-rt-${v:-14}-dev")
    fi
  else
    pkgs+=(libclang-rt-14-dev)
  fi
fi
# The systemd units' checks (systemd-analyze, -sysusers, -tmpfiles) and the Debian
# package built from the tree (tests/systemd/).
if [ "$what" = test ]; then
  need_bin systemd-analyze systemd
  need_bin dpkg-buildpackage dpkg-dev
  need_bin dh debhelper
fi
# The sql kind's PostgreSQL tests and benchmark start a server of their own
# (scripts/pg-test-server.sh): Debian's server binaries.
if [ "$what" = bench ] || [ "$what" = test ]; then
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || pkgs+=(postgresql)
  /usr/bin/python3 -c 'import psycopg2' 2>/dev/null || pkgs+=(python3-psycopg2)   # fills the test tables
fi
if [ "$what" = bench ] || [ "$what" = test ]; then
  /usr/bin/python3 -c 'import numpy' 2>/dev/null || pkgs+=(python3-numpy)
  /usr/bin/python3 -c 'import pytest' 2>/dev/null || pkgs+=(python3-pytest)
fi
if [ "$what" = test ]; then
  # pytest -n: the Python tests spread over the CPUs (scripts/run-tests.sh)
  /usr/bin/python3 -c 'import xdist' 2>/dev/null || pkgs+=(python3-pytest-xdist)
fi
if [ "$what" = bench ] || [ "$what" = test ]; then
  /usr/bin/python3 -c 'import torch' 2>/dev/null || pkgs+=(python3-torch)   # the torch integration tests
  /usr/bin/python3 -c 'import PIL' 2>/dev/null || pkgs+=(python3-pil)       # image pixels against PIL's
fi
if [ "$what" = test ]; then
  # `pip install ./client/python` into a fresh venv, offline (client/python/tests/test_install.py)
  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs+=(python3-venv)
  /usr/bin/python3 -c 'import setuptools' 2>/dev/null || pkgs+=(python3-setuptools)
  /usr/bin/python3 -c 'import wheel' 2>/dev/null || pkgs+=(python3-wheel)
  # the Python client's extension (make all builds it; the Python tests check it is used)
  /usr/bin/python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null || pkgs+=(python3-dev)
  command -v readelf >/dev/null 2>&1 || pkgs+=(binutils)
fi
if [ "$what" = bench ]; then
  /usr/bin/python3 -c 'import torchvision' 2>/dev/null || pkgs+=(python3-torchvision)
  need_bin fio fio                  # the disk's own random-read IOPS (bench/bench_cold.py)
fi
# make bench-peers: a virtual environment under build/ gets tf.data and DALI from PyPI.
if [ "$what" = peers ]; then
  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs+=(python3-venv)
  # SPDL's wheel decodes through the system's FFmpeg libraries (Debian 12: FFmpeg 5.1, whose
  # libavdevice pulls in the rest); without them every SPDL image load fails.
  dpkg -s libavdevice59 >/dev/null 2>&1 || pkgs+=(libavdevice59)
fi

# The object store tests' S3-compatible server (client/python/tests/s3server.py): moto's
# server from PyPI in a virtual environment under build/, made here so that its download
# is not counted in the tests' time. Best effort: without a network the tests say why they
# are skipped.
if [ "$what" = test ] && [ ${#pkgs[@]} -eq 0 ] && [ ! -x build/s3venv/bin/moto_server ]; then
  echo "deps: installing moto[server] into build/s3venv (for the object store tests)" >&2
  /usr/bin/python3 client/python/tests/s3server.py >/dev/null 2>&1 \
    || echo "deps: could not install moto[server]; the object store tests will be skipped" >&2
fi

# numpy 2 (Debian 12 has 1.24) for client/python/tests/test_numpy2.py, the same way.
if [ "$what" = test ] && [ ${#pkgs[@]} -eq 0 ] && [ ! -f build/np2venv/.ready ]; then
  echo "deps: installing numpy 2 into build/np2venv (for the numpy 2 test)" >&2
  /usr/bin/python3 client/python/tests/np2env.py >/dev/null 2>&1 \
    || echo "deps: could not install numpy 2; the numpy 2 test will be skipped" >&2
fi

if [ ${#pkgs[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing ${pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
else
  echo "deps: missing packages; install them with:" >&2
  echo "  sudo apt-get install ${pkgs[*]}" >&2
  exit 1
fi
