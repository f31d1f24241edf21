#!/usr/bin/env bash
# Runs one group of tests from a build directory and prints a summary.
#   scripts/run-tests.sh BUILD_DIR GROUP...
# Groups: unit (cmocka unit tests), integration (real loaderd + real client),
#         tsan (the concurrent parts, in a ThreadSanitizer build), python (pytest).
set -uo pipefail
summary=build/test-summary
if [ "${1:-}" = --total ]; then
  # The closing line of `make test`: every group's counts added up.
  awk '{p+=$1; f+=$2} END {printf "make test: %d passed, %d failed\n", p, f; exit (f > 0)}' "$summary"
  exit $?
fi
build=$1; shift
passed=0; failed=0; failures=()

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}
export LOADERD_BIN="$build/bin/loaderd"
export LOADERCTL_BIN="$build/bin/loaderctl"

run_cmocka() { # binary
  local bin=$1 out
  out=$(mktemp)
  echo "== $bin"
  "$bin" >"$out" 2>&1
  local rc=$?
  cat "$out"
  local p f
  p=$(grep -Eo '\[  PASSED  \] [0-9]+' "$out" | awk '{s+=$NF} END {print s+0}')
  f=$(grep -Eo '\[  FAILED  \] [0-9]+' "$out" | awk '{s+=$NF} END {print s+0}')
  rm -f "$out"
  passed=$((passed + p)); failed=$((failed + f))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
  if [ $rc -ne 0 ]; then failures+=("$bin (exit $rc)"); fi
}

for group in "$@"; do
  case $group in
    unit)
      for t in "$build"/test/test_*; do [ -x "$t" ] && run_cmocka "$t"; done ;;
    integration)
      for t in "$build"/test/itest_*; do [ -x "$t" ] && run_cmocka "$t"; done ;;
    tsan)
      # The concurrent parts: the worker pool, datasets read from many threads, and
      # the whole daemon (workers + loop thread) driven by the integration tests.
      for t in "$build"/test/test_pool "$build"/test/test_dataset "$build"/test/test_cache "$build"/test/itest_*; do
        [ -x "$t" ] && run_cmocka "$t"
      done ;;
    python)
      py=/usr/bin/python3
      if [ -d client/python/tests ] && "$py" -c 'import numpy, pytest' 2>/dev/null; then
        echo "== pytest client/python/tests"
        out=$(mktemp)
        LOADERCLIENT_LIB="$build/lib/libloaderclient.so" "$py" -m pytest -q client/python/tests 2>&1 | tee "$out"
        rc=${PIPESTATUS[0]}
        p=$(grep -Eo '[0-9]+ passed' "$out" | awk '{s+=$1} END {print s+0}')
        f=$(grep -Eo '[0-9]+ (failed|error)' "$out" | awk '{s+=$1} END {print s+0}')
        rm -f "$out"
        passed=$((passed + p)); failed=$((failed + f))
        if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then
          [ "$f" -eq 0 ] && failed=$((failed + 1))
          failures+=("pytest (exit $rc)")
        fi
      else
        echo "== python tests skipped: no client/python/tests or no python3 with numpy and pytest"
      fi ;;
    *) echo "unknown test group: $group" >&2; exit 2 ;;
  esac
done

echo
if [ ${#failures[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failures[@]}"
fi
echo "$build: $passed passed, $failed failed"
mkdir -p build && echo "$passed $failed" >> "$summary"
[ "$failed" -eq 0 ] && [ ${#failures[@]} -eq 0 ]
