#!/usr/bin/env bash
# Per-image CPU of loaderd's JPEG pipeline with each decode mode: the accurate default,
# decode.dct_scaling and decode.fast (README, "Image pipelines").
#
#   scripts/image-speed.sh [BUILD]        (default build/; run `make` first)
#
# Generates two ImageFolders with ld-genimages (ImageNet-like 256-500 px sides, and
# camera-like 1500-4000 px), starts loaderd with one worker and, for each folder and
# mode, reads two epochs of RandomResizedCrop 224 + flip (batch 32) and two of Resize
# 256 + CenterCrop 224 with `loaderctl read`, printing images/s and the daemon's CPU
# milliseconds per image (utime + stime of /proc/PID/stat over the read). The modes
# take turns, ROUNDS times (default 3), and the lowest CPU time of each is kept, so that
# a moment of load from elsewhere does not count. Takes a few minutes; it measures, it
# does not test.
set -euo pipefail
BUILD=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/$BUILD/bin
work=$(mktemp -d /tmp/ld-imgspeed.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$bin/ld-genimages" "$work/small" --count 1000 --classes 10 --min 256 --max 500 >/dev/null
"$bin/ld-genimages" "$work/large" --count 100 --classes 4 --min 1500 --max 4000 >/dev/null
cat "$work"/small/*/* "$work"/large/*/* >/dev/null      # warm the page cache

modes=(accurate "{}" dct_scaling "{dct_scaling: true}" fast "{fast: true}")
{
  printf 'server:\n  socket: %s/s.sock\n  workers: 1\n  log_level: warn\n  memory_budget: 256MiB\ndatasets:\n' "$work"
  for folder in small large; do
    for ((m = 0; m < ${#modes[@]}; m += 2)); do
      printf '  %s_rrc_%s:\n    kind: image_folder\n    path: %s\n    transforms:\n' "$folder" "${modes[m]}" "$work/$folder"
      printf '      - decode: %s\n      - random_resized_crop: {size: 224}\n      - random_flip: {}\n' "${modes[m+1]}"
      printf '  %s_eval_%s:\n    kind: image_folder\n    path: %s\n    transforms:\n' "$folder" "${modes[m]}" "$work/$folder"
      printf '      - decode: %s\n      - resize: {size: 256}\n      - center_crop: {size: 224}\n' "${modes[m+1]}"
    done
  done
} > "$work/loaderd.yaml"
"$bin/loaderd" --config "$work/loaderd.yaml" 2>"$work/log" &
pid=$!
for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.05; done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
tck=$(getconf CLK_TCK)
declare -A best_t best_r
for ((round = 0; round < ${ROUNDS:-3}; round++)); do
  for folder in small large; do
    for pipe in rrc eval; do
      for ((m = 0; m < ${#modes[@]}; m += 2)); do
        ds=${folder}_${pipe}_${modes[m]}
        t0=$(cpu_ticks)
        out=$("$bin/loaderctl" --socket "$work/s.sock" --json read "$ds" --epochs 2 --batch-size 32)
        t1=$(cpu_ticks)
        rate=$(printf '%s' "$out" | sed -n 's/.*"samples_per_s":[[:space:]]*\([0-9.]*\).*/\1/p' | tail -n 1)
        if [ -z "${best_t[$ds]:-}" ] || [ $((t1 - t0)) -lt "${best_t[$ds]}" ]; then
          best_t[$ds]=$((t1 - t0))
          best_r[$ds]=$rate
        fi
      done
    done
  done
done
printf '%-28s %10s %14s\n' dataset images/s "CPU ms/image"
for folder in small large; do
  n=$(find "$work/$folder" -name '*.jpg' | wc -l)
  for pipe in rrc eval; do
    for ((m = 0; m < ${#modes[@]}; m += 2)); do
      ds=${folder}_${pipe}_${modes[m]}
      awk -v ds="$ds" -v r="${best_r[$ds]}" -v t="${best_t[$ds]}" -v n="$n" -v hz="$tck" \
        'BEGIN { printf "%-28s %10.0f %14.2f\n", ds, r, t * 1000.0 / hz / (2 * n) }'
    done
  done
done
