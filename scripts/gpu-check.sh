#!/usr/bin/env bash
# scripts/gpu-check.sh — the GPU path of loaderd on a host with an NVIDIA GPU, in one
# command and under 5 minutes: builds with CUDA, starts loaderd on generated data, and
# runs the five checks of the device stage with BUILD/bin/ld-gpu-check
# (tests/gpu/gpu_check.cu):
#   1. identical   device batches are bit-identical to host batches: files (ragged),
#                  tokens, an image pipeline (uint8), and the on-GPU normalize (float16
#                  and float32) against the host pipeline's own normalize; transfer ipc
#                  and transfer client
#   2. throughput  the stage's host-to-device GB/s (the copy engine's time, from the
#                  daemon's `streams`) against a pinned cudaMemcpyAsync peak measured here
#                  on the same batch size: at least 90%
#   3. trainer     a synthetic trainer (one kernel of fixed duration per step) waits for
#                  data at most 5% of the time in steady state
#   4. leaks       cudaMemGetInfo and the daemon's counters before and after 50 trainers
#                  SIGKILLed while holding device batches: nothing is left
#   5. sanitizer   compute-sanitizer --tool memcheck over check 1 (the daemon and the
#                  trainer both under it): 0 errors
# Prints a one-screen summary and writes it with every log under
# $GPU_CHECK_RESULTS/<UTC time>-<host>/ (default results/gpu-check). Exit 0: all passed;
# 1: a check failed (the summary names it); 2: no GPU here (nothing was checked: it
# says why). GPU_CHECK_BUILD=DIR uses a CUDA build already there instead of building.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t_start=$(date +%s)
results_root=${GPU_CHECK_RESULTS:-results/gpu-check}
out=$results_root/$(date -u +%Y%m%d-%H%M%S)-$(hostname -s 2>/dev/null || echo host)
mkdir -p "$out"
summary=$out/summary.txt
log=$out/log.txt
: >"$log"
names=(build identical throughput trainer leaks sanitizer)
declare -A verdict detail
for n in "${names[@]}"; do verdict[$n]="not run"; detail[$n]=""; done
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/ld-gpu-check.XXXXXX")
daemon_pid=
stop_daemon() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    # Under compute-sanitizer, loaderd is the sanitizer's child: stop it, and let the
    # sanitizer write its summary and exit.
    local kids
    kids=$(ps -o pid= --ppid "$daemon_pid" 2>/dev/null)
    if [ -n "$kids" ]; then
      # shellcheck disable=SC2086
      kill -TERM $kids 2>/dev/null
      for _ in $(seq 1 300); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null
  fi
  daemon_pid=
}
cleanup() { stop_daemon; rm -rf "$run_dir"; }
trap cleanup EXIT

say() { echo "$*" | tee -a "$log"; }
finish() { # exit code
  local rc=$1 failed=() n
  for n in "${names[@]}"; do [ "${verdict[$n]}" = FAIL ] && failed+=("$n"); done
  [ "$rc" -ne 2 ] && [ ${#failed[@]} -gt 0 ] && rc=1
  {
    echo "loaderd GPU check — $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(($(date +%s) - t_start)) s"
    [ -n "${gpu_line:-}" ] && echo "$gpu_line"
    for n in "${names[@]}"; do
      printf '  %-11s %-8s %s\n' "$n" "${verdict[$n]}" "${detail[$n]}"
    done
    if [ "$rc" -eq 2 ]; then
      echo "NO GPU: ${no_gpu_reason:-} — nothing was checked"
    elif [ ${#failed[@]} -gt 0 ]; then
      echo "FAILED: ${failed[*]}"
    else
      echo "all checks passed"
    fi
    echo "logs: $out"
  } | tee "$summary"
  exit "$rc"
}
set_result() { # check PASS|FAIL detail
  verdict[$1]=$2; detail[$1]=$3
  say "$1: $2 $3"
}

# ---- build -----------------------------------------------------------------------------
if [ -n "${GPU_CHECK_BUILD:-}" ]; then
  build=$GPU_CHECK_BUILD
  set_result build PASS "using $build"
else
  build=build/gpu
  if ! command -v "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" >/dev/null 2>&1 && ! command -v nvcc >/dev/null 2>&1; then
    set_result build FAIL "no CUDA toolkit (nvcc) in ${CUDA_HOME:-/usr/local/cuda}"; finish 1
  fi
  if make --no-print-directory BUILD="$build" CUDA=1 -j"$(nproc)" all >"$out/build.log" 2>&1; then
    set_result build PASS "make CUDA=1 BUILD=$build"
  else
    tail -20 "$out/build.log"; set_result build FAIL "make CUDA=1 failed (build.log)"; finish 1
  fi
fi
check=$build/bin/ld-gpu-check
if [ ! -x "$check" ]; then
  set_result build FAIL "$check is missing: the build has no CUDA"; finish 1
fi

# ---- is there a GPU? --------------------------------------------------------------------
probe=$("$check" probe 2>&1); prc=$?
if [ $prc -eq 2 ]; then
  no_gpu_reason=${probe#no GPU present: }
  say "gpu-check: no GPU present: $no_gpu_reason"
  finish 2
elif [ $prc -ne 0 ]; then
  no_gpu_reason="the probe failed: $probe"; say "gpu-check: $no_gpu_reason"; finish 2
fi
gpu_line=$probe
say "$gpu_line"

# ---- data and daemon --------------------------------------------------------------------
data=${GPU_CHECK_DATA:-build/gpu-check-data}
mkdir -p "$data"
"$build/bin/ld-gendata" files "$data/files" --count 4096 --size 65536 --classes 8 --vary >>"$log" 2>&1
"$build/bin/ld-gendata" files "$data/big" --count 512 --size 4194304 >>"$log" 2>&1
"$build/bin/ld-gendata" tokens "$data/tokens.bin" --count 4000000 --dtype uint16 >>"$log" 2>&1
"$build/bin/ld-genimages" "$data/images" --count 512 --classes 4 >>"$log" 2>&1
pipe='      - resize: {size: 80}
      - center_crop: {height: 64, width: 64}'
norm='{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}'
norm_json='"mean":[0.485,0.456,0.406],"std":[0.229,0.224,0.225]'
img() { # name, tail of the pipeline
  printf '  %s:\n    kind: image_folder\n    path: %s\n    pattern: "*.jpg"\n    transforms:\n%s\n%s\n' \
    "$1" "$PWD/$data/images" "$pipe" "$2"
}
start_daemon() { # config [wrapper...]
  local cfg=$1; shift
  "$@" "$build/bin/loaderd" --config "$cfg" >>"$out/loaderd.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 300); do
    [ -S "$run_dir/s.sock" ] && "$build/bin/loaderctl" --socket "$run_dir/s.sock" status >/dev/null 2>&1 && return 0
    kill -0 "$daemon_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
cat >"$run_dir/loaderd.yaml" <<YAML
server:
  socket: $run_dir/s.sock
  workers: 0
  memory_budget: 8GiB
  device_memory_budget: 16GiB
  prefetch: 4
datasets:
  files:
    kind: files
    path: $PWD/$data/files
  big:
    kind: files
    path: $PWD/$data/big
  tokens:
    kind: token_windows
    path: $PWD/$data/tokens.bin
    context: 2048
$(img img_u8 '      - to_dtype: {dtype: uint8, layout: CHW}')
$(img img_hwc '      - to_dtype: {dtype: uint8, layout: HWC}')
$(img img_f16 "      - normalize: $norm
      - to_dtype: {dtype: float16, layout: CHW}")
$(img img_f32 "      - normalize: $norm
      - to_dtype: {dtype: float32, layout: CHW}")
YAML
sock=$run_dir/s.sock
if ! start_daemon "$run_dir/loaderd.yaml"; then
  tail -20 "$out/loaderd.log"; set_result identical FAIL "loaderd did not start (loaderd.log)"; finish 1
fi

step() { # check, timeout, command... : appends the output to the log; echoes the RESULT lines
  local name=$1 secs=$2; shift 2
  timeout -k 5 "$secs" "$@" >"$run_dir/step.out" 2>&1
  local rc=$?
  cat "$run_dir/step.out" >>"$log"
  grep '^RESULT' "$run_dir/step.out" || true
  [ $rc -eq 124 ] && echo "RESULT $name FAIL timed out after ${secs}s"
  [ $rc -ne 0 ] && ! grep -q '^RESULT .* FAIL' "$run_dir/step.out" && echo "RESULT $name FAIL exit $rc: $(tail -1 "$run_dir/step.out")"
  return $rc
}

# ---- 1. identical ------------------------------------------------------------------------
identical_runs() { # prefix command (a wrapper such as compute-sanitizer), or nothing
  local ok=0 n=0 res
  local -
  set -f # the JSON below goes unquoted through word splitting, never through globbing
  for spec in "files files 64" "files files 64 --client" "tokens tokens 16" "img_u8 img_u8 32" \
              "img_u8 img_u8 32 --client" \
              "img_f16 img_hwc 32 --normalize {\"field\":\"image\",$norm_json,\"dtype\":\"float16\",\"layout\":\"HWC\"}" \
              "img_f32 img_u8 32 --normalize {\"field\":\"image\",$norm_json,\"dtype\":\"float32\",\"layout\":\"CHW\"}"; do
    read -r hds dds bs extra <<<"$spec"
    n=$((n + 1))
    # shellcheck disable=SC2086
    res=$(step identical 60 "$@" "$check" identical "$sock" "$hds" "$dds" "$bs" 8 $extra) && ok=$((ok + 1))
    echo "$res"
  done
  [ $ok -eq $n ]
}
if res=$(identical_runs); then
  set_result identical PASS "7 runs: files, files (client), tokens, images uint8 (ipc, client), normalize f16 HWC->CHW, f32"
else
  set_result identical FAIL "$(grep FAIL <<<"$res" | head -2 | sed 's/^RESULT identical FAIL //' | tr '\n' ';')"
fi

# ---- 2. throughput -------------------------------------------------------------------------
# 64 MiB batches of 4 MiB files: the copy engine's time per batch from the daemon, and the
# pinned peak of the same size.
peak=$(step peak 60 "$check" peak $((64 << 20)))
peak_gbps=$(sed -n 's/^RESULT peak PASS \([0-9.]*\) GB.*/\1/p' <<<"$peak")
tr=$(step trainer 120 "$check" trainer "$sock" big 16 60 1)
stage_gbps=$(sed -n 's/.*stage h2d_gbps \([0-9.]*\).*/\1/p' <<<"$tr")
if [ -n "$peak_gbps" ] && [ -n "$stage_gbps" ]; then
  pct=$(awk -v s="$stage_gbps" -v p="$peak_gbps" 'BEGIN {printf "%.1f", 100 * s / p}')
  if awk -v x="$pct" 'BEGIN {exit !(x >= 90)}'; then
    set_result throughput PASS "stage $stage_gbps GB/s = $pct% of the pinned peak $peak_gbps GB/s (64 MiB batches)"
  else
    set_result throughput FAIL "stage $stage_gbps GB/s = $pct% of the pinned peak $peak_gbps GB/s (target 90%)"
  fi
else
  set_result throughput FAIL "no measurement: $(tr '\n' ' ' <<<"$peak $tr" | cut -c1-160)"
fi

# ---- 3. trainer ----------------------------------------------------------------------------
tr=$(step trainer 120 "$check" trainer "$sock" img_u8 64 200 5)
wf=$(sed -n 's/.*wait_fraction \([0-9.]*\).*/\1/p' <<<"$tr")
if grep -q '^RESULT trainer PASS' <<<"$tr"; then
  set_result trainer PASS "wait fraction $wf (200 steps of 5 ms, images batch 64)"
else
  set_result trainer FAIL "wait fraction ${wf:-?}: $(sed 's/^RESULT trainer FAIL //' <<<"$tr" | head -1 | cut -c1-120)"
fi

# ---- 4. leaks -------------------------------------------------------------------------------
lk=$(step leaks 180 "$check" churn "$sock" files 64 50)
if grep -q '^RESULT churn PASS' <<<"$lk"; then
  set_result leaks PASS "$(sed 's/^RESULT churn PASS //' <<<"$lk" | cut -c1-150)"
else
  set_result leaks FAIL "$(sed 's/^RESULT churn FAIL //' <<<"$lk" | head -1 | cut -c1-150)"
fi
if ! "$build/bin/loaderctl" --socket "$sock" status >/dev/null 2>&1; then
  set_result leaks FAIL "loaderd stopped answering after the SIGKILLed trainers"
fi
stop_daemon

# ---- 5. compute-sanitizer ------------------------------------------------------------------
cs=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [ ! -x "$cs" ]; then
  set_result sanitizer FAIL "compute-sanitizer not found (CUDA toolkit)"
else
  rm -f "$run_dir/s.sock"
  if start_daemon "$run_dir/loaderd.yaml" "$cs" --tool memcheck --log-file "$out/sanitizer-loaderd.log"; then
    identical_runs "$cs" --tool memcheck --error-exitcode 99 >"$out/sanitizer-trainer.txt" 2>&1; irc=$?
    stop_daemon
    errs=$(grep -ho 'ERROR SUMMARY: [0-9]* error' "$out/sanitizer-loaderd.log" "$log" 2>/dev/null | awk '{s+=$3} END {print s+0}')
    if [ $irc -eq 0 ] && [ "$errs" -eq 0 ] && grep -q 'ERROR SUMMARY' "$out/sanitizer-loaderd.log"; then
      set_result sanitizer PASS "memcheck: 0 errors (loaderd and the identical checks under it)"
    else
      set_result sanitizer FAIL "memcheck: $errs errors, checks exit $irc (sanitizer-*.log)"
    fi
  else
    set_result sanitizer FAIL "loaderd did not start under compute-sanitizer (loaderd.log)"
  fi
fi
finish 0
