#!/usr/bin/env bash
# Soak test: one loaderd under many epochs and client churn for minutes, with its
# resident memory, open descriptors and /dev/shm objects sampled over time. Exits
# non-zero when, back at idle, the daemon holds more than when it started:
#   RSS        more than SOAK_MAX_RSS_DRIFT_KIB above its idle RSS after the warm-up
#   fds        any descriptor more than before the first client, or more io_uring
#              instances than the read-ahead has I/O threads (each keeps one)
#   /dev/shm   any ring object left, any stream or leased slot left in `status`
#   read-ahead any byte left in a dataset's read-ahead buffers, any sample pending or
#              entry in its read-once table (`datasets`)
# Not part of `make test` (it takes minutes); run it with `make soak` or directly:
#   scripts/soak.sh [SECONDS]          default 300; a build in $BUILD (default build)
# Knobs (environment): SOAK_CLIENTS (concurrent trainers, 6), SOAK_KILL_PCT (share of
# trainers SIGKILLed mid-read, 25), SOAK_INTERVAL (seconds between samples, 10),
# SOAK_WARMUP (seconds before the RSS baseline, 30), SOAK_MAX_RSS_DRIFT_KIB (4096),
# SOAK_SEED (the churn's random seed), SOAK_CSV (also write the samples there),
# SOAK_COLD (seconds: empty the page cache that often during the churn, so that the files
# are cold and read-ahead's I/O threads and read-once buffers work under the kills; root).
set -uo pipefail

duration=${1:-${SOAK_SECONDS:-300}}
build=${BUILD:-build}
clients=${SOAK_CLIENTS:-6}
kill_pct=${SOAK_KILL_PCT:-25}
interval=${SOAK_INTERVAL:-10}
warmup=${SOAK_WARMUP:-30}
max_rss_drift=${SOAK_MAX_RSS_DRIFT_KIB:-4096}
seed=${SOAK_SEED:-$$}
csv=${SOAK_CSV:-}
cold=${SOAK_COLD:-}
loaderd=$build/bin/loaderd
loaderctl=$build/bin/loaderctl
gendata=$build/bin/ld-gendata
py=/usr/bin/python3

for b in "$loaderd" "$loaderctl" "$gendata"; do
  [ -x "$b" ] || { echo "soak: $b is missing; run make (or set BUILD)" >&2; exit 2; }
done
if [ -n "$cold" ] && ! { [ "$cold" -gt 0 ] 2>/dev/null && [ -w /proc/sys/vm/drop_caches ]; }; then
  echo "soak: SOAK_COLD=$cold needs a number of seconds and root (writing /proc/sys/vm/drop_caches)" >&2; exit 2
fi
if [ "$warmup" -ge "$duration" ]; then
  echo "soak: the warm-up ($warmup s) must be shorter than the run ($duration s)" >&2; exit 2
fi
RANDOM=$seed

dir=$(mktemp -d "${TMPDIR:-/tmp}/ld-soak.XXXXXX")
sock=$dir/s.sock
daemon=0
cleanup() {
  local p
  for p in $(jobs -p); do kill -9 "$p" 2>/dev/null; done
  [ "$daemon" -gt 0 ] && kill -9 "$daemon" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$gendata" files "$dir/rec" --count 4000 --size 2048 --classes 10 --vary >/dev/null || exit 2
"$gendata" tokens "$dir/tokens.bin" --count 2000000 >/dev/null || exit 2
cat >"$dir/loaderd.yaml" <<EOF
server:
  socket: $sock
  workers: 2
  max_clients: 64
  log_level: warn
datasets:
  records:
    kind: files
    path: rec
  tokens:
    kind: token_windows
    path: tokens.bin
    context: 256
EOF
# A sanitized daemon (BUILD=build/asan) would grow by ASan's quarantine of freed memory
# (256 MiB by default, and up to 1 MiB more in each thread that frees: the read-ahead's
# 32 I/O threads come into use one after another), which is not a leak: keep both small
# so that drift means something.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4:thread_local_quarantine_size_kb=64" \
  "$loaderd" --config "$dir/loaderd.yaml" >"$dir/loaderd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && "$loaderctl" --socket "$sock" status >/dev/null 2>&1 && break; sleep 0.1; done
"$loaderctl" --socket "$sock" status >/dev/null 2>&1 || { echo "soak: loaderd did not start:"; cat "$dir/loaderd.log"; exit 2; }

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$daemon/status" 2>/dev/null || echo -1; }
# Descriptors, less the read-ahead I/O threads' io_uring instances (one per thread at
# most, made with a thread's first group and kept while the daemon runs: counted apart).
fds() { find "/proc/$daemon/fd" -mindepth 1 -printf '%l\n' 2>/dev/null | grep -vc '^anon_inode:\[io_uring\]$'; }
rings() { find "/proc/$daemon/fd" -mindepth 1 -printf '%l\n' 2>/dev/null | grep -c '^anon_inode:\[io_uring\]$'; }
shm() { ls /dev/shm 2>/dev/null | grep -c "^loaderd\.$daemon\." ; }
# streams and leased slots from the daemon's own status
held() {
  "$loaderctl" --socket "$sock" --json status 2>/dev/null |
    "$py" -c 'import json,sys; s=json.load(sys.stdin); print(s["streams"], s["slots"]["leased"], s["clients"])' 2>/dev/null ||
    echo "? ? ?"
}
# ra EXPR FALLBACK: EXPR (Python) over the datasets' read-ahead counters, where
# n(key) sums a counter over the datasets and m(key) takes its largest value;
# FALLBACK when the daemon does not answer.
ra() {
  "$loaderctl" --socket "$sock" --json datasets 2>/dev/null |
    "$py" -c 'import json,sys
r=[d.get("read_ahead") or {} for d in json.load(sys.stdin)["datasets"]]
n=lambda k: sum(x.get(k, 0) for x in r)
m=lambda k: max([x.get(k, 0) for x in r] + [0])
print(*eval(sys.argv[1]))' "$1" 2>/dev/null || echo "$2"
}
io_threads() { ra '[m("threads")]' 0; }
# samples read ahead and rows copied from read-once buffers, over the datasets
read_ahead() { ra '[n("samples"), n("read_once")]' "? ?"; }
# what the datasets' read-ahead holds: bytes in buffers + samples pending + table entries
buffered() { ra '[n("buffered_bytes") + n("pending") + n("entries")]' "?"; }

idle_fds=$(fds)
idle_rss=$(rss)
echo "soak: loaderd $daemon for ${duration}s, $clients trainers at a time, ${kill_pct}% killed, seed $seed${cold:+, page cache emptied every ${cold}s}"
printf '%6s %10s %5s %5s %8s %7s %8s\n' time rss_kib fds shm streams leased trainers
[ -n "$csv" ] && echo "time,rss_kib,fds,shm,streams,leased,trainers" >"$csv"

# One trainer: a random dataset, batch size and number of epochs; some are SIGKILLed
# after a random moment, the others read to the end. The wrapper subshell reaps it
# (so bash's "Killed" notice goes to /dev/null) and is what we track.
trainer() {
  local ds=records bs=$((16 << (RANDOM % 4))) epochs=$((1 + RANDOM % 3)) delay=-1
  [ $((RANDOM % 3)) -eq 0 ] && ds=tokens
  [ $((RANDOM % 100)) -lt "$kill_pct" ] && delay=0.$((RANDOM % 1000))
  (
    "$loaderctl" --socket "$sock" --timeout 20000 read "$ds" --epochs "$epochs" --batch-size "$bs" \
      --seed "$RANDOM" --touch >/dev/null 2>>"$dir/trainers.err" &
    p=$!
    if [ "$delay" != -1 ]; then sleep "$delay"; kill -9 "$p" 2>/dev/null; fi
    wait "$p"
  ) 2>/dev/null &
  trainers+=("$!")
  started=$((started + 1))
}

sample() { # elapsed
  local r f s streams leased
  read -r streams leased _ <<<"$(held)"
  r=$(rss); f=$(fds); s=$(shm)
  printf '%6d %10d %5d %5d %8s %7s %8d\n' "$1" "$r" "$f" "$s" "$streams" "$leased" "$started"
  [ -n "$csv" ] && echo "$1,$r,$f,$s,$streams,$leased,$started" >>"$csv"
  rss_series+=("$r")
}

# Keeps `clients` trainers running until `until` seconds into the run, sampling.
churn() { # until
  local now alive p
  while :; do
    now=$((SECONDS - start))
    [ "$now" -ge "$1" ] && break
    alive=()
    for p in "${trainers[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    trainers=("${alive[@]}")
    while [ "${#trainers[@]}" -lt "$clients" ]; do trainer; done
    if [ "$now" -ge "$next_sample" ]; then sample "$now"; next_sample=$((now + interval)); fi
    if [ -n "$cold" ] && [ "$now" -ge "$next_drop" ]; then
      sync; echo 1 >/proc/sys/vm/drop_caches; drops=$((drops + 1)); next_drop=$((now + cold))
    fi
    sleep 0.2
  done
}

# Lets the running trainers finish (30 s at most, then kills them) and waits up to
# 10 s for the daemon to be idle again.
drain() {
  local deadline=$((SECONDS + 30)) p streams leased nclients
  for p in "${trainers[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  trainers=()
  for _ in $(seq 100); do
    read -r streams leased nclients <<<"$(held)"
    [ "$streams" = 0 ] && [ "$leased" = 0 ] && [ "$nclients" = 1 ] && [ "$(shm)" = 0 ] &&
      [ "$(fds)" -le "$idle_fds" ] && [ "$(buffered)" = 0 ] && break
    sleep 0.1
  done
}

start=$SECONDS
next_sample=0
next_drop=0
drops=0
declare -a rss_series=() trainers=()
started=0
churn "$warmup"
drain
base_rss=$(rss)
echo "-- idle after warm-up: RSS $base_rss KiB, $(fds) fds, $(shm) ring objects"
churn "$duration"
drain
kill -0 "$daemon" 2>/dev/null || { echo "soak: loaderd died:"; tail -20 "$dir/loaderd.log"; exit 1; }
end_rss=$(rss); end_fds=$(fds); end_shm=$(shm); end_buffered=$(buffered)
read -r streams leased _ <<<"$(held)"
max_rss=$(printf '%s\n' "${rss_series[@]}" | sort -n | tail -1)
echo "-- idle at the end:    RSS $end_rss KiB, $end_fds fds, $end_shm ring objects"
echo
echo "soak: $started trainers over ${duration}s${cold:+, the page cache emptied $drops times}"
echo "soak: RSS idle: at start ${idle_rss} KiB, after warm-up ${base_rss} KiB, at the end ${end_rss} KiB" \
     "(drift $((end_rss - base_rss)) KiB, bound ${max_rss_drift}); peak under load ${max_rss} KiB"
end_rings=$(rings); end_threads=$(io_threads)
echo "soak: fds idle at start ${idle_fds}, at the end ${end_fds} (and ${end_rings} io_uring, ${end_threads} I/O threads); /dev/shm objects at the end ${end_shm};" \
     "streams ${streams}, leased ${leased}"
status=0
if [ $((end_rss - base_rss)) -gt "$max_rss_drift" ]; then echo "soak: FAIL: RSS drifted by more than ${max_rss_drift} KiB"; status=1; fi
if [ "$end_fds" -gt "$idle_fds" ]; then echo "soak: FAIL: $((end_fds - idle_fds)) descriptors more than at start"; status=1; fi
if [ "$end_rings" -gt "$end_threads" ]; then echo "soak: FAIL: $end_rings io_uring instances for $end_threads I/O threads"; status=1; fi
if [ "$end_shm" -ne 0 ]; then echo "soak: FAIL: ring objects left in /dev/shm"; status=1; fi
if [ "$streams" != 0 ] || [ "$leased" != 0 ]; then echo "soak: FAIL: streams or leased slots left"; status=1; fi
if [ "$end_buffered" != 0 ]; then echo "soak: FAIL: read-ahead holds $end_buffered (bytes buffered + samples pending + table entries)"; status=1; fi
if [ -n "$cold" ]; then
  read -r ahead once <<<"$(read_ahead)"
  echo "soak: read ahead: $ahead samples, $once of them copied from read-once buffers"
  if [ "$ahead" = 0 ] || [ "$ahead" = "?" ]; then echo "soak: FAIL: the page cache was emptied but nothing was read ahead"; status=1; fi
fi
if grep -qiE 'sanitizer|fatal|assert' "$dir/loaderd.log"; then
  echo "soak: FAIL: loaderd reported:"; grep -iE 'sanitizer|fatal|assert' "$dir/loaderd.log" | head -5; status=1
fi
[ $status -eq 0 ] && echo "soak: OK"
exit $status
