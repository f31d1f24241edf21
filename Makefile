# loaderd — one Makefile for the daemon, the client library, loaderctl and the tests.
#
#   make                 optimized build into build/ (bin/loaderd, bin/loaderctl, lib/libloaderclient.*)
#   make test            unit + integration tests under ASan+UBSan (build/asan), the
#                        concurrent parts under TSan (build/tsan), the Python tests, each
#                        fuzzer for a few seconds, and an -O0 build of everything without
#                        CUDA (the other variant when the main build has it), whose device
#                        stage, ring and wire are unit-tested
#   make install         binaries, libloaderclient, headers, loaderclient.pc, systemd units
#                        and the example config under $(DESTDIR)$(PREFIX) (PREFIX=/usr/local)
#   make demo            generate a small dataset, start loaderd, read two epochs, stop
#   make bench           loaderd vs PyTorch DataLoader, then the dataset cache, images and
#                        the Python client in a training loop; results in
#                        bench/results/<date>-<host>.{json,md} (see bench/README.md)
#   make bench-peers     loaderd vs tf.data, DALI and SPDL (installed from PyPI once, into
#                        $(BUILD)/peers/venv) on the same data and cores; bench/results/peers.*
#   make fuzz            each libFuzzer harness (tests/fuzz/) for FUZZ_SECONDS (default 60)
#   make soak            minutes of client churn, RSS/fd//dev/shm drift judged (scripts/soak.sh)
#   SANITIZE=address,undefined   build with sanitizers (any -fsanitize= list)
#   OPT_LEVEL=-O0        override the optimization level
#   CUDA=auto|0|1        device-stage backend (auto: on when nvcc's cudart is found)
#
# Objects land in $(BUILD); a change of flags rebuilds everything (see $(BUILD)/.flags).

BUILD    ?= build
SANITIZE ?=
CUDA     ?= auto
CUDA_HOME ?= /usr/local/cuda
CC       ?= cc

PKGS := libuv libcjson yaml-0.1 libsystemd libxxhash libturbojpeg libjpeg libpng sqlite3 libpq
# The object store client (daemon/s3.c): libcurl for HTTP, libcrypto for SigV4's
# SHA-256 and HMAC, libxml2 for the listings and error documents.
PKGS += libcurl libcrypto libxml-2.0
# Cold storage's read-ahead (daemon/coldread.c) starts a group of reads with one
# io_uring submission.
PKGS += liburing
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)
CJSON_LIBS := $(shell pkg-config --libs libcjson 2>/dev/null)
# The client library reads server.socket from the daemon's YAML config (client_socket.c).
CLIENT_LIBS := $(CJSON_LIBS) $(shell pkg-config --libs yaml-0.1 2>/dev/null)

ifeq ($(CUDA),auto)
  HAVE_CUDA := $(if $(and $(wildcard $(CUDA_HOME)/include/cuda_runtime.h),$(wildcard $(CUDA_HOME)/bin/nvcc),$(wildcard $(CUDA_HOME)/lib64/libcudart_static.a)),1,0)
else
  HAVE_CUDA := $(CUDA)
endif
# CUDA: the runtime is linked statically (libcudart_static loads the driver when first
# used), so one loaderd and one libloaderclient start on hosts with and without a GPU.
# Only daemon/device_cuda.c and client/client_device.c include cuda_runtime.h; the
# kernels (daemon/*.cu) are built by nvcc for every major architecture, without C++
# exceptions or guarded statics so that the C linker needs no libstdc++.
NVCC ?= $(CUDA_HOME)/bin/nvcc
NVCC_ARCH ?= -arch=all-major
ifeq ($(HAVE_CUDA),1)
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
  CUDA_INC := -I$(CUDA_HOME)/include
  CU_SRC := $(sort $(wildcard daemon/*.cu))
else
  CUDA_LIBS :=
  CUDA_INC :=
  CU_SRC :=
endif
# Every link of the daemon's modules or of the client library needs the runtime.
PKG_LIBS += $(CUDA_LIBS)
CJSON_LIBS += $(CUDA_LIBS)
CLIENT_LIBS += $(CUDA_LIBS)
# The variant `make test` builds (at -O0) besides the main one, so that neither rots,
# and whose device-stage unit tests it runs (run-tests.sh's device group; the rest of
# the unit tests include timing budgets meant for optimized builds): without CUDA when
# the main build has it. A host without the toolkit can build only the variant without.
OTHER_CUDA := 0

# ---- version and layering ----------------------------------------------------------
# One version, in VERSION: the daemon, the library (soname, lc_version_number) and the
# Python package (pyproject.toml reads the same file) all take it from there.
VERSION_STR := $(strip $(file < VERSION))
VERSION_WORDS := $(subst ., ,$(VERSION_STR))
VERSION_MAJOR := $(word 1,$(VERSION_WORDS))
VERSION_NUMBER := $(shell echo $$(( $(word 1,$(VERSION_WORDS)) * 10000 + $(word 2,$(VERSION_WORDS)) * 100 + $(word 3,$(VERSION_WORDS)) )))
VERSION_DEFS := -DLD_VERSION=\"$(VERSION_STR)\" -DLD_VERSION_NUMBER=$(VERSION_NUMBER)

# Warnings: -Wall -Wextra catch the usual; -Wundef makes a misspelt feature flag
# (LD_HAVE_*) a compile error; -Wshadow and -Wstrict-prototypes keep declarations
# honest; -Werror so that a warning never lands.
WARN := -Wall -Wextra -Werror -Wundef -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wno-unused-parameter -Wvla -Wformat=2
# OPT_LEVEL overrides the optimization (make test also builds everything at -O0, where
# a missing library shows: the optimizer no longer inlines its calls away).
OPT_LEVEL ?=
OPT  := $(or $(OPT_LEVEL),$(if $(SANITIZE),-O1 -fno-omit-frame-pointer,-O2))
SAN  := $(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-sanitize-recover=undefined,)
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) $(SAN) -fPIC -fvisibility=hidden -pthread \
        -MMD -MP $(PKG_CFLAGS) \
        -DLD_HAVE_CUDA=$(HAVE_CUDA) -DLD_HAVE_SYSTEMD=1 $(VERSION_DEFS) $(CFLAGS)
LDFLAGS_ALL := $(SAN) -pthread $(LDFLAGS)

# Include paths per directory, so that the layering is a compile error, not a
# convention: proto/ (the wire) and client/ (libloaderclient, loaderctl) see only
# proto/ and client/; the daemon, its tools and the unit tests see everything.
INC_WIRE   := -Iproto -Iclient
INC_DAEMON := -Idaemon -Iproto -Iclient
INC = $(INC_DAEMON)
$(BUILD)/obj/proto/%.o: INC = $(INC_WIRE)
$(BUILD)/obj/client/%.o: INC = $(INC_WIRE)
$(BUILD)/obj/tools/loaderctl%.o: INC = $(INC_WIRE)
$(BUILD)/obj/tests/integration/%.o: INC = $(INC_WIRE) -Itests/integration

PROTO_SRC  := $(sort $(wildcard proto/*.c))
CORE_SRC   := $(filter-out daemon/main.c,$(sort $(wildcard daemon/*.c)))
CLIENT_SRC := $(sort $(wildcard client/*.c))
UNIT_SRC   := $(sort $(wildcard tests/unit/test_*.c))
ITEST_SRC  := $(sort $(wildcard tests/integration/itest_*.c))

comma := ,
obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

PROTO_OBJ  := $(call obj,$(PROTO_SRC))
CORE_OBJ   := $(call obj,$(CORE_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))

LOADERD   := $(BUILD)/bin/loaderd
LOADERCTL := $(BUILD)/bin/loaderctl
GENDATA   := $(BUILD)/bin/ld-gendata
GENIMAGES := $(BUILD)/bin/ld-genimages
IMGFLOOR  := $(BUILD)/bin/ld-imgfloor
COPYFLOOR := $(BUILD)/bin/ld-copyfloor
CLIENTSHIM := $(BUILD)/lib/ld-clientshim.so
# The client library: the real file carries the full version, the soname the major
# (a trainer links against libloaderclient.so.MAJOR), and the .so link is for -l.
CLIENT_SONAME := libloaderclient.so.$(VERSION_MAJOR)
CLIENT_SO_REAL := $(BUILD)/lib/libloaderclient.so.$(VERSION_STR)
CLIENT_SO := $(BUILD)/lib/libloaderclient.so
CLIENT_A  := $(BUILD)/lib/libloaderclient.a
CORE_A    := $(BUILD)/lib/libloaderd_core.a
UNIT_BIN  := $(patsubst tests/unit/%.c,$(BUILD)/test/%,$(UNIT_SRC))
# Transform plug-ins: examples/plugins/NAME.c becomes $(BUILD)/lib/ld-plugin-NAME.so.
PLUGINS   := $(patsubst examples/plugins/%.c,$(BUILD)/lib/ld-plugin-%.so,$(sort $(wildcard examples/plugins/*.c)))
# Broken plug-ins for test_transform's error paths (tests/unit/plugin_fixture.c).
TEST_PLUGINS := $(patsubst %,$(BUILD)/test/plugins/fixture-%.so,nosym badabi v2only failinit failapply)
ITEST_BIN := $(patsubst tests/integration/%.c,$(BUILD)/test/%,$(ITEST_SRC))
# libFuzzer harnesses (tests/fuzz/fuzz_NAME.c), built with clang into build/fuzz.
FUZZ_SRC  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN  := $(patsubst tests/fuzz/%.c,$(BUILD)/test/%,$(FUZZ_SRC))
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 10
FUZZ_SAN  := address,undefined,fuzzer-no-link

.PHONY: all deps test demo bench bench-peers clean tests fuzz fuzzers fuzz-seeds soak
# Keep the objects of test programs (make would delete them as intermediates, and build
# them again on the next run).
.SECONDARY:
# The GPU check's program (scripts/gpu-check.sh), in CUDA builds without sanitizers.
GPU_CHECK := $(if $(and $(filter 1,$(HAVE_CUDA)),$(if $(SANITIZE),,1)),$(BUILD)/bin/ld-gpu-check)
# The Python client's optional extension (client/python/loaderclient/_speedups.c, the
# per-batch steps in C): built beside libloaderclient.so, where the package looks for it
# in a source checkout, when Python's headers (Debian: python3-dev) and numpy's are
# there, for Python 3.10 or later (the C API it uses). Not in sanitized builds: a Python
# that is not sanitized cannot load it.
PYTHON ?= /usr/bin/python3
PY_CFG := $(if $(SANITIZE),,$(shell $(PYTHON) -c 'import sys, sysconfig, numpy; sys.version_info >= (3, 10) and print(sysconfig.get_paths()["include"], numpy.get_include(), sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null))
PY_INC := $(word 1,$(PY_CFG))
NP_INC := $(word 2,$(PY_CFG))
PY_SPEEDUPS := $(if $(and $(wildcard $(PY_INC)/Python.h),$(wildcard $(NP_INC)/numpy/arrayobject.h)),$(BUILD)/lib/_speedups$(word 3,$(PY_CFG)))
all: $(LOADERD) $(LOADERCTL) $(GENDATA) $(GENIMAGES) $(IMGFLOOR) $(COPYFLOOR) $(CLIENTSHIM) $(CLIENT_SO) $(CLIENT_A) $(PLUGINS) $(GPU_CHECK) $(PY_SPEEDUPS)
tests: $(UNIT_BIN) $(ITEST_BIN)

# Rebuild everything when the flags change.
FLAGS_FILE := $(BUILD)/.flags
$(shell mkdir -p $(BUILD) && echo '$(CC) $(CFLAGS_ALL) $(LDFLAGS_ALL)' > $(FLAGS_FILE).new && \
  (cmp -s $(FLAGS_FILE).new $(FLAGS_FILE) || mv $(FLAGS_FILE).new $(FLAGS_FILE)); rm -f $(FLAGS_FILE).new)

$(BUILD)/obj/%.o: %.c $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(INC) $(XINC) $(XCFLAGS) -c $< -o $@

# xxHash's XXH3 compiled for AVX2, for the cache's sample checksums: called only where
# the CPU has AVX2 (daemon/cache_hash.c asks it). Without sanitizers, so that the object
# has no constructor of theirs (run at start-up on every CPU, and compiled for AVX2 as
# well); the library's XXH3 that the other CPUs call is not instrumented either.
$(BUILD)/obj/daemon/cache_hash_avx2.o: XCFLAGS = $(if $(findstring x86_64,$(shell $(CC) -dumpmachine)),-mavx2 $(if $(SANITIZE),-fno-sanitize=all))
$(BUILD)/obj/daemon/cache_hash_avx2.o: Makefile

$(BUILD)/obj/%.o: %.cu $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 $(NVCC_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-fno-exceptions,-fno-threadsafe-statics \
	  -MMD -MP -c $< -o $@

# The two files that may include cuda_runtime.h.
$(BUILD)/obj/daemon/device_cuda.o $(BUILD)/obj/client/client_device.o: XINC = $(CUDA_INC)

$(CORE_A): $(CORE_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(CLIENT_A): $(CLIENT_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(CLIENT_SO_REAL): $(CLIENT_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,$(CLIENT_SONAME) -Wl,--no-undefined $(if $(CUDA_LIBS),-Wl$(comma)--exclude-libs$(comma)libcudart_static.a) \
	  -o $@ $^ $(LDFLAGS_ALL) $(CLIENT_LIBS) -lm

$(CLIENT_SO): $(CLIENT_SO_REAL)
	ln -sf libloaderclient.so.$(VERSION_STR) $(BUILD)/lib/$(CLIENT_SONAME)
	ln -sf $(CLIENT_SONAME) $@

$(LOADERD): $(call obj,daemon/main.c) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(PKG_LIBS) -ldl -lm

$(LOADERCTL): $(call obj,$(sort $(wildcard tools/loaderctl*.c))) $(CLIENT_A)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(CLIENT_LIBS) $(shell pkg-config --libs libxxhash) -lm

$(GENDATA): $(call obj,tools/gendata.c)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL)

$(GENIMAGES): $(call obj,tools/genimages.c)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(shell pkg-config --libs libturbojpeg 2>/dev/null)

$(BUILD)/bin/ld-gpu-check: tests/gpu/gpu_check.cu $(CLIENT_A) $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 $(NVCC_ARCH) $(INC_WIRE) -Xcompiler -Wall,-Wextra -o $@ $< $(CLIENT_A) $(CLIENT_LIBS) -lm

# The image benchmark's floor (bench-only) links the daemon's decoder, resampler and
# pipeline, as unit tests do.
$(IMGFLOOR): $(call obj,bench/ld-imgfloor.c) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(PKG_LIBS) -ldl -lm

# The floor of the pre-decoded workloads (bench-only): a file read or a window copied per
# sample on one core, no loader around it.
$(COPYFLOOR): $(call obj,bench/ld-copyfloor.c)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL)

# Between the Python client's extension and the library in bench_python's per-batch
# measurements (bench-only; loaded with ctypes).
$(CLIENTSHIM): $(call obj,bench/ld-clientshim.c)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $^ $(LDFLAGS_ALL)

# Python's and numpy's headers as system headers (their own style is not checked), the
# project's warnings for the module itself; nothing linked: the interpreter provides
# Python's symbols, numpy's come through its capsule (import_array).
PY_SPEEDUPS_SRC := $(sort $(wildcard client/python/loaderclient/_speedups*.c))
$(PY_SPEEDUPS): $(PY_SPEEDUPS_SRC) client/python/loaderclient/_speedups.h $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) -fPIC -fvisibility=hidden -shared \
	  -isystem $(PY_INC) -isystem $(NP_INC) $(CFLAGS) -o $@ $(PY_SPEEDUPS_SRC) $(LDFLAGS)

# Unit tests link the daemon's modules (no socket, no process); integration tests link
# only the public client library and drive a real loaderd.
$(BUILD)/test/test_%: $(call obj,tests/unit/test_%.c) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(PKG_LIBS) $(CMOCKA_LIBS) -ldl -lm

# Plug-ins are loaded with dlopen; no --no-undefined, since a sanitized plug-in leaves
# the sanitizer's symbols to the process that loads it.
$(BUILD)/lib/ld-plugin-%.so: $(call obj,examples/plugins/%.c)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $^ $(LDFLAGS_ALL)

$(BUILD)/test/plugins/fixture-%.so: tests/unit/plugin_fixture.c daemon/transform_plugin.h $(FLAGS_FILE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(INC_DAEMON) -DFIXTURE_$* -shared -o $@ $< $(LDFLAGS_ALL)

# test_transform dlopens the example plug-in and the broken ones (order-only: they
# are not linked in).
$(BUILD)/test/test_transform: | $(PLUGINS) $(TEST_PLUGINS)

# Every other file in tests/integration/ (harness.c, probe.c) is linked into each test.
ITEST_LIB_SRC := $(filter-out tests/integration/itest_%.c,$(sort $(wildcard tests/integration/*.c)))
$(BUILD)/test/itest_%: $(call obj,tests/integration/itest_%.c) $(call obj,$(ITEST_LIB_SRC)) $(CLIENT_A)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(CLIENT_LIBS) $(CMOCKA_LIBS) -lm

# A fuzzer links the daemon's modules, built with -fsanitize=fuzzer-no-link so that
# libFuzzer sees their coverage; only the harness's link adds libFuzzer's main.
$(BUILD)/test/fuzz_%: $(call obj,tests/fuzz/fuzz_%.c) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CC) -fsanitize=fuzzer -o $@ $^ $(LDFLAGS_ALL) $(PKG_LIBS) -ldl -lm

# fuzz_reply drives the client library's decoders (client_internal.h).
$(BUILD)/test/fuzz_reply: $(CLIENT_A)

$(BUILD)/bin/ld-gen-seeds: $(call obj,tests/fuzz/gen_seeds.c) $(CORE_A)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(PKG_LIBS) -ldl -lm

fuzzers: $(FUZZ_BIN)

# ---- install ---------------------------------------------------------------------
# `make install PREFIX=/usr DESTDIR=/tmp/stage`: the daemon and loaderctl, the client
# library (libloaderclient.so.X.Y.Z with its soname and -l links, and the .a), its
# headers and loaderclient.pc, the example config and README, and (install-systemd,
# below) the systemd units. Nothing is written outside $(DESTDIR)$(PREFIX) unless a
# *DIR says so.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DATADIR    ?= $(PREFIX)/share
DOCDIR     ?= $(DATADIR)/doc/loaderd
INSTALL    ?= install
CLIENT_HEADERS := client/loaderclient.h client/loaderclient_errors.h

.PHONY: install uninstall
install: all install-systemd
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	  $(DESTDIR)$(DOCDIR)/examples
	$(INSTALL) -m 755 $(LOADERD) $(LOADERCTL) $(DESTDIR)$(BINDIR)/
	$(INSTALL) -m 755 $(CLIENT_SO_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sf libloaderclient.so.$(VERSION_STR) $(DESTDIR)$(LIBDIR)/$(CLIENT_SONAME)
	ln -sf $(CLIENT_SONAME) $(DESTDIR)$(LIBDIR)/libloaderclient.so
	$(INSTALL) -m 644 $(CLIENT_A) $(DESTDIR)$(LIBDIR)/
	$(INSTALL) -m 644 $(CLIENT_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	  -e 's|@VERSION@|$(VERSION_STR)|g' -e 's|@CUDA_LIBS@|$(CUDA_LIBS)|g' \
	  client/loaderclient.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/loaderclient.pc
	chmod 644 $(DESTDIR)$(PKGCONFIGDIR)/loaderclient.pc
	$(INSTALL) -m 644 config/loaderd.yaml $(DESTDIR)$(DOCDIR)/examples/loaderd.yaml
	$(INSTALL) -m 644 README.md $(DESTDIR)$(DOCDIR)/README.md

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/loaderd $(DESTDIR)$(BINDIR)/loaderctl \
	  $(DESTDIR)$(LIBDIR)/libloaderclient.so.$(VERSION_STR) $(DESTDIR)$(LIBDIR)/$(CLIENT_SONAME) \
	  $(DESTDIR)$(LIBDIR)/libloaderclient.so $(DESTDIR)$(LIBDIR)/libloaderclient.a \
	  $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(CLIENT_HEADERS))) $(DESTDIR)$(PKGCONFIGDIR)/loaderclient.pc \
	  $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.service $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.socket \
	  $(DESTDIR)$(SYSUSERS_DIR)/loaderd.conf $(DESTDIR)$(TMPFILES_DIR)/loaderd.conf \
	  $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.service.d/gpu.conf
	rm -rf $(DESTDIR)$(DOCDIR) $(DESTDIR)$(DATADIR)/loaderd

deps:
	@scripts/deps.sh build

# The test run: sanitized unit tests, then integration tests against a sanitized daemon,
# then the concurrent parts again under ThreadSanitizer, then the Python client.
# Its builds use every CPU unless make was given -j (the sub-makes then share its job
# slots); run-tests.sh runs a group's programs TEST_JOBS at a time (default: the CPUs).
# Under ThreadSanitizer only what the tsan group runs is built: the daemon, the
# integration tests and the unit tests of the concurrent parts (run-tests.sh --tsan-units).
NPROC := $(shell nproc 2>/dev/null || echo 1)
TEST_J = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))
TSAN_UNIT_BIN = $(patsubst %,$(BUILD)/test/%,$(shell scripts/run-tests.sh --tsan-units))
.PHONY: tsan-tests
tsan-tests: $(TSAN_UNIT_BIN) $(ITEST_BIN)

test:
	@scripts/deps.sh test
	@mkdir -p build && rm -f build/test-summary
	@scripts/run-tests.sh --time "build build/asan" $(MAKE) --no-print-directory $(TEST_J) BUILD=build/asan SANITIZE=address,undefined all tests
	scripts/run-tests.sh build/asan unit integration
	@scripts/run-tests.sh --time "build build/tsan" $(MAKE) --no-print-directory $(TEST_J) BUILD=build/tsan SANITIZE=thread all tsan-tests
	scripts/run-tests.sh build/tsan tsan
	@scripts/run-tests.sh --time "build build" $(MAKE) --no-print-directory $(TEST_J) all
	scripts/run-tests.sh build python gpu
	@scripts/run-tests.sh --time "build build/fuzz" $(MAKE) --no-print-directory $(TEST_J) BUILD=build/fuzz CC=clang SANITIZE=$(FUZZ_SAN) fuzzers
	FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) scripts/run-tests.sh build/fuzz fuzz
	@scripts/run-tests.sh --time "build build/o0" $(MAKE) --no-print-directory $(TEST_J) BUILD=build/o0 OPT_LEVEL=-O0 CUDA=$(OTHER_CUDA) all tests
	scripts/run-tests.sh build/o0 device
	scripts/run-tests.sh build systemd
	@scripts/run-tests.sh --total

# Each fuzzer for FUZZ_SECONDS (default 60) from its seed corpus, under ASan+UBSan;
# findings go to build/fuzz/crashes/. `make test` runs them for a few seconds each.
fuzz:
	@scripts/deps.sh fuzz
	@mkdir -p build && rm -f build/test-summary
	$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang SANITIZE=$(FUZZ_SAN) fuzzers
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/run-tests.sh build/fuzz fuzz
	@scripts/run-tests.sh --total "make fuzz"

# Minutes of client churn against one optimized daemon, with RSS, fd and /dev/shm drift
# reported and judged (scripts/soak.sh; SOAK_SECONDS, default 300). Not part of make test.
SOAK_SECONDS ?= 300
soak:
	@scripts/deps.sh build
	$(MAKE) --no-print-directory all
	scripts/soak.sh $(SOAK_SECONDS)

# Regenerates the committed seed corpora (tests/fuzz/corpus/) from tests/fuzz/gen_seeds.c;
# the regression inputs kept there (regress-*) are left alone.
fuzz-seeds:
	@scripts/deps.sh fuzz
	$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang SANITIZE=$(FUZZ_SAN) build/fuzz/bin/ld-gen-seeds
	find tests/fuzz/corpus -type f ! -name 'regress-*' -delete 2>/dev/null; \
	  build/fuzz/bin/ld-gen-seeds tests/fuzz/corpus

demo:
	@scripts/deps.sh build
	$(MAKE) --no-print-directory all
	scripts/demo.sh

bench:
	@scripts/deps.sh bench
	$(MAKE) --no-print-directory all
	/usr/bin/python3 bench/run.py

# Not part of make bench or make test: the first run downloads about 1 GB from PyPI.
bench-peers:
	@scripts/deps.sh bench
	@scripts/deps.sh peers
	$(MAKE) --no-print-directory all
	/usr/bin/python3 bench/bench_peers.py --build-dir $(BUILD)

clean:
	rm -rf build client/python/build client/python/loaderclient.egg-info

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- systemd units, the service user and the runtime directory ----------------------
# `make install-systemd` (run by `make install`) puts loaderd.service and loaderd.socket
# where systemd looks for local units, and the sysusers.d and tmpfiles.d entries that
# create the loaderd user and /run/loaderd. The units name $(PREFIX)/bin/loaderd. The
# GPU hosts' drop-in (systemd/loaderd-gpu.conf) is shipped under share/loaderd/systemd,
# and installed as loaderd.service.d/gpu.conf with GPU_DROPIN=yes.
GPU_DROPIN ?= no
PREFIX ?= /usr/local
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
SYSUSERS_DIR ?= $(PREFIX)/lib/sysusers.d
TMPFILES_DIR ?= $(PREFIX)/lib/tmpfiles.d

.PHONY: install-systemd
install-systemd:
	install -d $(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(SYSUSERS_DIR) $(DESTDIR)$(TMPFILES_DIR)
	sed 's|/usr/local/|$(PREFIX)/|g' systemd/loaderd.service > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.service
	install -m 0644 systemd/loaderd.socket $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.socket
	install -m 0644 systemd/loaderd.sysusers $(DESTDIR)$(SYSUSERS_DIR)/loaderd.conf
	install -m 0644 systemd/loaderd.tmpfiles $(DESTDIR)$(TMPFILES_DIR)/loaderd.conf
	install -d $(DESTDIR)$(DATADIR)/loaderd/systemd
	install -m 0644 systemd/loaderd-gpu.conf $(DESTDIR)$(DATADIR)/loaderd/systemd/loaderd-gpu.conf
	$(if $(filter yes,$(GPU_DROPIN)),install -d $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.service.d && \
	  install -m 0644 systemd/loaderd-gpu.conf $(DESTDIR)$(SYSTEMD_UNIT_DIR)/loaderd.service.d/gpu.conf)
