#!/usr/bin/env bash
# make demo: generate small sample datasets (records, tokens, JPEGs), start loaderd on a
# temporary socket, read them with loaderctl (the built-in benchmark client; the records
# dataset builds its single-file cache during the first epoch), show the daemon's
# status, stop it cleanly and check that nothing is left in /dev/shm.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/bin
data=${DEMO_DATA:-build/demo-data}
run=$(mktemp -d "${TMPDIR:-/tmp}/loaderd-demo.XXXXXX")
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; fi
  rm -rf "$run"
}
trap cleanup EXIT

echo "== generating a sample dataset in $data"
mkdir -p "$data"
"$bin/ld-gendata" files "$data/records" --count 20000 --size 3072 --classes 10
"$bin/ld-gendata" tokens "$data/tokens.bin" --count 20000000 --dtype uint16
"$bin/ld-genimages" "$data/images" --count 1000 --classes 10

cat > "$run/loaderd.yaml" <<YAML
server:
  socket: $run/loaderd.sock
  workers: 0          # one per core
  memory_budget: 256MiB
  log_level: info
datasets:
  records:
    kind: files
    path: $PWD/$data/records
    pattern: "*.bin"
    cache: {path: $run/records.ldcache}   # built during the first epoch, read from then on
  tokens:
    kind: token_windows
    path: $PWD/$data/tokens.bin
    dtype: uint16
    context: 1024
  images:
    kind: image_folder
    path: $PWD/$data/images
    pattern: "*.jpg"
    transforms:
      - random_resized_crop: {size: 224}
      - random_flip: {p: 0.5}
      - to_dtype: {dtype: uint8, layout: CHW}
YAML

echo "== starting loaderd"
"$bin/loaderd" --config "$run/loaderd.yaml" 2> >(sed 's/^/  [loaderd] /' >&2) &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$run/loaderd.sock" ] && break; sleep 0.1; done
ctl() { "$bin/loaderctl" --socket "$run/loaderd.sock" "$@"; }

echo "== loaderctl datasets"; ctl datasets
echo "== loaderctl read records (3 epochs, batch 64: epoch 0 from the files while the cache builds)"
ctl read records --epochs 3 --batch-size 64
echo "== loaderctl cache info records"; ctl cache info records
echo "== loaderctl read tokens (2 epochs, batch 32)"; ctl read tokens --epochs 2 --batch-size 32
echo "== loaderctl read images (2 epochs, batch 64: decode, random resized crop 224, flip)"
ctl read images --epochs 2 --batch-size 64
echo "== loaderctl status"; ctl status

echo "== stopping loaderd (SIGTERM)"
kill -TERM "$daemon_pid"
wait "$daemon_pid"; rc=$?
daemon_pid=
left=$(ls /dev/shm | grep -c "^loaderd\." || true)
echo "loaderd exited with status $rc; shared-memory objects left: $left"
[ "$rc" -eq 0 ] && [ "$left" -eq 0 ]
