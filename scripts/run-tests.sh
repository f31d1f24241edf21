#!/usr/bin/env bash
# Runs one group of tests from a build directory and prints a summary.
#   scripts/run-tests.sh BUILD_DIR GROUP...
#   scripts/run-tests.sh --total [LABEL]  the closing line (LABEL: "make test")
# Groups: unit (cmocka unit tests), integration (real loaderd + real client),
#         tsan (the concurrent parts, in a ThreadSanitizer build), python (pytest),
#         systemd (the units, as installed), fuzz (each libFuzzer harness for $FUZZ_SECONDS seconds, default 10),
#         gpu (scripts/gpu-check.sh says that there is no GPU, where there is none),
#         device (the device stage's unit tests alone: for the build variant without CUDA).
#
# Every program runs under a timeout (TEST_TIMEOUT seconds, default 300; pytest
# PYTEST_TIMEOUT, default 600), so a deadlock fails the run instead of hanging it.
# Each group appends "passed failed skipped" to build/test-summary; --total adds them up.
set -uo pipefail
summary=build/test-summary
if [ "${1:-}" = --total ]; then
  # The closing line of `make test`: every group's counts added up.
  awk -v label="${2:-make test}" '{p+=$1; f+=$2; s+=$3}
       END {printf "%s: %d passed, %d failed", label, p, f
            if (s > 0) printf ", %d skipped", s
            printf "\n"; exit (f > 0)}' "$summary"
  exit $?
fi
build=$1; shift
passed=0; failed=0; skipped=0; failures=()
test_timeout=${TEST_TIMEOUT:-300}
pytest_timeout=${PYTEST_TIMEOUT:-600}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}
export LOADERD_BIN="$build/bin/loaderd"
export LOADERCTL_BIN="$build/bin/loaderctl"

# Sums the numbers that follow `pattern` (an ERE) in file.
count() { # file pattern
  grep -Eo "$2 [0-9]+" "$1" | awk '{s+=$NF} END {print s+0}'
}

run_cmocka() { # binary
  local bin=$1 out rc p f s
  out=$(mktemp)
  echo "== $bin"
  # -k: a program that ignores SIGTERM (a wedged sanitizer report) is killed 10 s later.
  timeout -k 10 "$test_timeout" "$bin" >"$out" 2>&1
  rc=$?
  cat "$out"
  p=$(count "$out" '\[  PASSED  \]')
  f=$(count "$out" '\[  FAILED  \]')
  s=$(count "$out" '\[  SKIPPED \]')
  rm -f "$out"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "== $bin: timed out after ${test_timeout}s"
    failed=$((failed + 1)); failures+=("$bin (timed out after ${test_timeout}s)")
    return
  fi
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
  if [ $rc -ne 0 ]; then failures+=("$bin (exit $rc)"); fi
}

# One libFuzzer harness for $FUZZ_SECONDS from its committed seed corpus; new inputs
# go to a scratch corpus (the committed one is only read), a crash to
# $build/crashes/NAME-*. Counts as one test.
run_fuzzer() { # binary
  local bin=$1 name work out rc secs=${FUZZ_SECONDS:-10}
  name=$(basename "$bin")
  work=$(mktemp -d)
  out=$(mktemp)
  mkdir -p "$build/crashes"
  echo "== $bin (${secs}s)"
  timeout -k 10 $((secs + 120)) "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
    -artifact_prefix="$build/crashes/${name#fuzz_}-" -print_final_stats=1 \
    "$work" "tests/fuzz/corpus/${name#fuzz_}" >"$out" 2>&1
  rc=$?
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|stat::number_of_executed_units|ERROR|SUMMARY|Test unit written' "$out"
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    echo "$name: 1 passed, 0 failed"
  else
    tail -n 60 "$out"
    failed=$((failed + 1))
    failures+=("$bin (exit $rc; reproduce with: $bin $build/crashes/${name#fuzz_}-*)")
    echo "$name: 0 passed, 1 failed"
  fi
  rm -rf "$work" "$out"
}

for group in "$@"; do
  case $group in
    unit)
      for t in "$build"/test/test_*; do [ -x "$t" ] && run_cmocka "$t"; done ;;
    integration)
      for t in "$build"/test/itest_*; do [ -x "$t" ] && run_cmocka "$t"; done ;;
    device)
      # The device stage, the ring's state machine and the wire: what differs between a
      # build with CUDA and one without (make test runs it on the other variant).
      for t in "$build"/test/test_device "$build"/test/test_ring "$build"/test/test_proto; do
        if [ -x "$t" ]; then run_cmocka "$t"; else failed=$((failed + 1)); failures+=("$t is missing"); fi
      done ;;
    tsan)
      # The concurrent parts: the worker pool, datasets read from many threads, the
      # cache keeper's thread, the I/O threads of cold reads, and the whole daemon
      # (workers + loop thread) driven by the integration tests.
      for t in "$build"/test/test_pool "$build"/test/test_hub "$build"/test/test_stream "$build"/test/test_handoff "$build"/test/test_dataset "$build"/test/test_cache \
               "$build"/test/test_cache_keeper "$build"/test/test_sql "$build"/test/test_ioqueue "$build"/test/test_coldread \
               "$build"/test/itest_*; do
        [ -x "$t" ] && run_cmocka "$t"
      done ;;
    fuzz)
      found=0
      for t in "$build"/test/fuzz_*; do [ -x "$t" ] && found=1 && run_fuzzer "$t"; done
      if [ $found -eq 0 ]; then
        failed=$((failed + 1)); failures+=("no fuzzer in $build/test")
      fi ;;
    systemd)
      # The units as installed: systemd-analyze verify and security, sysusers.d, tmpfiles.d;
      # then the Debian package.
      echo "== tests/systemd/check-units.sh"
      out=$(mktemp)
      timeout -k 10 "$test_timeout" tests/systemd/check-units.sh "$build" 2>&1 | tee "$out"
      rc=${PIPESTATUS[0]}
      last=$(grep -E '^systemd units: ' "$out" | tail -1)
      p=$(echo "$last" | grep -Eo '[0-9]+ passed' | awk '{print $1+0}')
      f=$(echo "$last" | grep -Eo '[0-9]+ failed' | awk '{print $1+0}')
      s=$(echo "$last" | grep -Eo '[0-9]+ skipped' | awk '{print $1+0}')
      rm -f "$out"
      passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
      if [ $rc -ne 0 ]; then
        [ "${f:-0}" -eq 0 ] && failed=$((failed + 1))
        failures+=("tests/systemd/check-units.sh (exit $rc)")
      fi
      # The Debian package, built from this tree and run unpacked (about a minute).
      echo "== tests/systemd/check-deb.sh"
      timeout -k 10 "$test_timeout" tests/systemd/check-deb.sh
      rc=$?
      if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
      elif [ $rc -eq 2 ]; then
        echo "== check-deb skipped: install dpkg-dev and debhelper to build the package"
        skipped=$((skipped + 1))
      else
        failed=$((failed + 1)); failures+=("tests/systemd/check-deb.sh (exit $rc)")
      fi ;;
    gpu)
      # scripts/gpu-check.sh on this host, with this build: where there is no GPU it must
      # say so, write its summary and exit 2 (nothing checked, nothing pretended); where
      # there is one, run it by hand (it takes minutes and builds its own tree).
      echo "== scripts/gpu-check.sh (no GPU here)"
      if [ -e /dev/nvidiactl ]; then
        echo "== a GPU is present: run scripts/gpu-check.sh"
        skipped=$((skipped + 1))
      elif [ ! -x "$build/bin/ld-gpu-check" ]; then
        echo "== $build has no ld-gpu-check (a build without CUDA): nothing to run"
        skipped=$((skipped + 1))
      else
        res=$(mktemp -d)
        out=$(GPU_CHECK_BUILD="$build" GPU_CHECK_RESULTS="$res" timeout -k 10 60 scripts/gpu-check.sh 2>&1)
        rc=$?
        echo "$out"
        if [ $rc -eq 2 ] && grep -q '^gpu-check: no GPU present: ' <<<"$out" \
           && grep -q '^NO GPU: .* nothing was checked$' "$res"/*/summary.txt 2>/dev/null \
           && grep -q '^  identical   not run' "$res"/*/summary.txt; then
          passed=$((passed + 1))
        else
          failed=$((failed + 1)); failures+=("scripts/gpu-check.sh without a GPU (exit $rc, expected 2 and its summary)")
        fi
        rm -rf "$res"
      fi ;;
    python)
      py=/usr/bin/python3
      if [ -d client/python/tests ] && "$py" -c 'import numpy, pytest' 2>/dev/null; then
        echo "== pytest client/python/tests"
        out=$(mktemp)
        LOADERCLIENT_LIB="$build/lib/libloaderclient.so" timeout -k 10 "$pytest_timeout" \
          "$py" -m pytest -q client/python/tests 2>&1 | tee "$out"
        rc=${PIPESTATUS[0]}
        p=$(grep -Eo '[0-9]+ passed' "$out" | awk '{s+=$1} END {print s+0}')
        f=$(grep -Eo '[0-9]+ (failed|errors?)' "$out" | awk '{s+=$1} END {print s+0}')
        s=$(grep -Eo '[0-9]+ skipped' "$out" | awk '{s+=$1} END {print s+0}')
        rm -f "$out"
        passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
          failed=$((failed + 1)); failures+=("pytest (timed out after ${pytest_timeout}s)")
        elif [ $rc -eq 5 ]; then
          # Exit 5: no tests collected. A suite that ran nothing is a failure, not a pass.
          failed=$((failed + 1)); failures+=("pytest (no tests collected)")
        elif [ $rc -ne 0 ]; then
          [ "$f" -eq 0 ] && failed=$((failed + 1))
          failures+=("pytest (exit $rc)")
        fi
      else
        # Not silently green: a machine without the Python stack fails the run.
        echo "== python tests cannot run: no client/python/tests or no $py with numpy and pytest"
        failed=$((failed + 1)); failures+=("python tests (no $py with numpy and pytest)")
      fi ;;
    *) echo "unknown test group: $group" >&2; exit 2 ;;
  esac
done

echo
if [ ${#failures[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failures[@]}"
fi
line="$build: $passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
mkdir -p build && echo "$passed $failed $skipped" >> "$summary"
[ "$failed" -eq 0 ] && [ ${#failures[@]} -eq 0 ]
