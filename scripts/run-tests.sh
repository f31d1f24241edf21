#!/usr/bin/env bash
# Runs one group of tests from a build directory and prints a summary.
#   scripts/run-tests.sh BUILD_DIR GROUP...
#   scripts/run-tests.sh --total [LABEL]  the closing line (LABEL: "make test")
#   scripts/run-tests.sh --time LABEL COMMAND...  runs COMMAND (a build), its times noted
#   scripts/run-tests.sh --tsan-units     the unit tests that the tsan group runs
# Groups: unit (cmocka unit tests), integration (real loaderd + real client),
#         tsan (the concurrent parts, in a ThreadSanitizer build), python (pytest),
#         systemd (the units, as installed), fuzz (each libFuzzer harness for $FUZZ_SECONDS seconds, default 10),
#         gpu (scripts/gpu-check.sh says that there is no GPU, where there is none),
#         device (the device stage's unit tests alone: for the build variant without CUDA).
#
# Every program runs under a timeout (TEST_TIMEOUT seconds, default 300; pytest
# PYTEST_TIMEOUT, default 600), so a deadlock fails the run instead of hanging it.
# The programs of a group run TEST_JOBS at a time (default: the number of CPUs, at most
# 4; 1 runs them one after the other), and pytest spreads its tests over as many
# processes when pytest-xdist is installed. Each program's output is printed whole, in
# the group's order, followed by its wall-clock and CPU time (its own and its children's,
# the daemons it started included).
# Each group appends "passed failed skipped wall_s cpu_s label" to build/test-summary
# (--time a build's, with no tests); --total adds the counts up and lists the times.
set -uo pipefail
summary=build/test-summary
# The unit tests of the concurrent parts, which the tsan group runs with every
# integration test: the worker pool, the hub, streams and the hand-off, datasets read
# from many threads, the cache keeper's thread, the I/O threads of cold reads.
tsan_units="test_pool test_hub test_stream test_handoff test_dataset test_cache test_cache_keeper test_sql test_ioqueue test_coldread"
if [ "${1:-}" = --tsan-units ]; then
  echo "$tsan_units"
  exit 0
fi
if [ "${1:-}" = --time ]; then
  label=$2; shift 2
  mkdir -p build
  TIMEFORMAT='%R %U %S'
  { time { "$@"; rc=$?; }; } 2>build/.time.$$
  read -r real user sys <build/.time.$$; rm -f build/.time.$$
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.1f", u + s}')
  echo "$label: $real s wall, CPU $cpu s"
  echo "0 0 0 $real $cpu $label" >> "$summary"
  exit $rc
fi
if [ "${1:-}" = --total ]; then
  # The closing line of `make test`: every group's counts added up.
  awk -v label="${2:-make test}" '{p+=$1; f+=$2; s+=$3
         if (NF >= 6) { t = $6; for (i = 7; i <= NF; i++) t = t " " $i
                        printf "time: %-28s %7.1f s wall, %7.1f s CPU\n", t, $4, $5; w += $4; c += $5 } }
       END {if (w > 0) printf "time: %-28s %7.1f s wall, %7.1f s CPU (builds and tests)\n", "all", w, c
            printf "%s: %d passed, %d failed", label, p, f
            if (s > 0) printf ", %d skipped", s
            printf "\n"; exit (f > 0)}' "$summary"
  exit $?
fi
build=$1; shift
groups="$*"
passed=0; failed=0; skipped=0; failures=()
test_timeout=${TEST_TIMEOUT:-300}
pytest_timeout=${PYTEST_TIMEOUT:-600}
ncpu=$(nproc 2>/dev/null || echo 2)
test_jobs=${TEST_JOBS:-$((ncpu < 4 ? ncpu : 4))}
[ "$test_jobs" -ge 1 ] 2>/dev/null || test_jobs=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
TIMEFORMAT='%R %U %S'
group_start=$(date +%s.%N)
group_cpu=0   # seconds, the sum of each program's

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}
export LOADERD_BIN="$build/bin/loaderd"
export LOADERCTL_BIN="$build/bin/loaderctl"

# Sums the numbers that follow `pattern` (an ERE) in file.
count() { # file pattern
  grep -Eo "$2 [0-9]+" "$1" | awk '{s+=$NF} END {print s+0}'
}

# Adds "wall cpu" seconds (from bash's time: real user sys) to the group's CPU time and
# prints the program's time line.
account_time() { # name timefile
  local real user sys cpu
  read -r real user sys < "$2" || { real=0; user=0; sys=0; }
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.1f", u + s}')
  group_cpu=$(awk -v a="$group_cpu" -v b="$cpu" 'BEGIN {printf "%.1f", a + b}')
  printf '== %s: %.1f s, CPU %s s\n' "$1" "$real" "$cpu"
}

# Runs a command into $o.out with its exit status in $o.rc and its times in $o.time;
# $o.done marks the end.
run_timed() { # o command...
  local o=$1; shift
  { time { "$@" >"$o.out" 2>&1; echo $? >"$o.rc"; }; } 2>"$o.time"
  : >"$o.done"
}

# The programs of a group, $test_jobs at a time: start_KIND runs one in the background
# (into files under $scratch), report_KIND prints and counts it once it and every
# program before it are done, so the output reads as if they ran one by one.
# A program in $run_alone starts once the ones before it are done, and the next starts
# after it: it measures how the daemon shares the CPUs, which other programs would skew.
run_alone=" itest_sched "
run_programs() { # kind program...
  local kind=$1; shift
  local progs=("$@") next=0 i alone limit
  for ((i = 0; i < ${#progs[@]}; i++)); do
    alone=0; [[ $run_alone == *" $(basename "${progs[i]}") "* ]] && alone=1
    limit=$test_jobs; [ $alone -eq 1 ] && limit=1
    while [ "$(jobs -rp | wc -l)" -ge "$limit" ]; do
      wait -n
      while [ $next -lt $i ] && [ -e "$scratch/$next.done" ]; do report_"$kind" "${progs[next]}" "$scratch/$next"; next=$((next + 1)); done
    done
    start_"$kind" "${progs[i]}" "$scratch/$i" &
    if [ $alone -eq 1 ]; then
      wait
      while [ $next -le $i ]; do report_"$kind" "${progs[next]}" "$scratch/$next"; next=$((next + 1)); done
    fi
  done
  while [ $next -lt ${#progs[@]} ]; do
    [ -e "$scratch/$next.done" ] || wait -n
    while [ $next -lt ${#progs[@]} ] && [ -e "$scratch/$next.done" ]; do report_"$kind" "${progs[next]}" "$scratch/$next"; next=$((next + 1)); done
  done
  rm -f "$scratch"/*
}

start_cmocka() { # binary o
  # -k: a program that ignores SIGTERM (a wedged sanitizer report) is killed 10 s later.
  run_timed "$2" timeout -k 10 "$test_timeout" "$1"
}

report_cmocka() { # binary o
  local bin=$1 out=$2.out rc p f s
  rc=$(cat "$2.rc")
  echo "== $bin"
  cat "$out"
  p=$(count "$out" '\[  PASSED  \]')
  f=$(count "$out" '\[  FAILED  \]')
  s=$(count "$out" '\[  SKIPPED \]')
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  account_time "$bin" "$2.time"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "== $bin: timed out after ${test_timeout}s"
    failed=$((failed + 1)); failures+=("$bin (timed out after ${test_timeout}s)")
    return
  fi
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
  if [ "$rc" -ne 0 ]; then failures+=("$bin (exit $rc)"); fi
}

# One libFuzzer harness for $FUZZ_SECONDS from its committed seed corpus; new inputs
# go to a scratch corpus (the committed one is only read), a crash to
# $build/crashes/NAME-*. Counts as one test.
start_fuzz() { # binary o
  local bin=$1 name secs=${FUZZ_SECONDS:-10}
  name=$(basename "$bin")
  mkdir -p "$2.corpus" "$build/crashes"
  run_timed "$2" timeout -k 10 $((secs + 120)) "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
    -artifact_prefix="$build/crashes/${name#fuzz_}-" -print_final_stats=1 \
    "$2.corpus" "tests/fuzz/corpus/${name#fuzz_}"
  rm -rf "$2.corpus"
}

report_fuzz() { # binary o
  local bin=$1 out=$2.out rc name
  name=$(basename "$bin")
  rc=$(cat "$2.rc")
  echo "== $bin (${FUZZ_SECONDS:-10}s)"
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|stat::number_of_executed_units|ERROR|SUMMARY|Test unit written' "$out"
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "$name: 1 passed, 0 failed"
  else
    tail -n 60 "$out"
    failed=$((failed + 1))
    failures+=("$bin (exit $rc; reproduce with: $bin $build/crashes/${name#fuzz_}-*)")
    echo "$name: 0 passed, 1 failed"
  fi
  account_time "$bin" "$2.time"
}

# The executables among the arguments (a glob that matched nothing is not one).
programs() { local t; for t in "$@"; do [ -x "$t" ] && echo "$t"; done; }

for group in "$@"; do
  case $group in
    unit)
      mapfile -t progs < <(programs "$build"/test/test_*)
      run_programs cmocka "${progs[@]}" ;;
    integration)
      mapfile -t progs < <(programs "$build"/test/itest_*)
      run_programs cmocka "${progs[@]}" ;;
    device)
      # The device stage, the ring's state machine and the wire: what differs between a
      # build with CUDA and one without (make test runs it on the other variant).
      progs=()
      for t in "$build"/test/test_device "$build"/test/test_ring "$build"/test/test_proto; do
        if [ -x "$t" ]; then progs+=("$t"); else failed=$((failed + 1)); failures+=("$t is missing"); fi
      done
      run_programs cmocka "${progs[@]}" ;;
    tsan)
      # The concurrent parts ($tsan_units, above), and the whole daemon (workers + loop
      # thread) driven by the integration tests.
      progs=()
      for t in $tsan_units; do
        if [ -x "$build/test/$t" ]; then progs+=("$build/test/$t"); else failed=$((failed + 1)); failures+=("$build/test/$t is missing"); fi
      done
      mapfile -t -O ${#progs[@]} progs < <(programs "$build"/test/itest_*)
      run_programs cmocka "${progs[@]}" ;;
    fuzz)
      mapfile -t progs < <(programs "$build"/test/fuzz_*)
      if [ ${#progs[@]} -eq 0 ]; then
        failed=$((failed + 1)); failures+=("no fuzzer in $build/test")
      else
        run_programs fuzz "${progs[@]}"
      fi ;;
    systemd)
      # The units as installed: systemd-analyze verify and security, sysusers.d, tmpfiles.d;
      # then the Debian package.
      echo "== tests/systemd/check-units.sh"
      out=$(mktemp)
      { time { timeout -k 10 "$test_timeout" tests/systemd/check-units.sh "$build" 2>&1 | tee "$out"
               rc=${PIPESTATUS[0]}; }; } 2>"$scratch/units.time"
      account_time tests/systemd/check-units.sh "$scratch/units.time"
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
      { time { timeout -k 10 "$test_timeout" tests/systemd/check-deb.sh 2>&1; rc=$?; }; } 2>"$scratch/deb.time"
      account_time tests/systemd/check-deb.sh "$scratch/deb.time"
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
        # pytest-xdist (Debian's python3-pytest-xdist): each worker process has its own
        # daemon (conftest.py's session fixtures), so the tests stay apart.
        xdist=()
        if [ "$test_jobs" -gt 1 ] && "$py" -c 'import xdist' 2>/dev/null; then xdist=(-n "$test_jobs"); fi
        echo "== pytest ${xdist[*]} client/python/tests"
        out=$(mktemp)
        { time { LOADERCLIENT_LIB="$build/lib/libloaderclient.so" timeout -k 10 "$pytest_timeout" \
                   "$py" -m pytest -q --durations=8 "${xdist[@]}" client/python/tests 2>&1 | tee "$out"
                 rc=${PIPESTATUS[0]}; }; } 2>"$scratch/pytest.time"
        account_time pytest "$scratch/pytest.time"
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
wall=$(awk -v a="$group_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
echo "$build $groups: $wall s wall, CPU $group_cpu s ($test_jobs at a time)"
line="$build: $passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
mkdir -p build && echo "$passed $failed $skipped $wall $group_cpu $build $groups" >> "$summary"
[ "$failed" -eq 0 ] && [ ${#failures[@]} -eq 0 ]
