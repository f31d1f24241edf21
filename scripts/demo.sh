#!/usr/bin/env bash
# make demo: generate small sample datasets (records, tokens, JPEGs), start loaderd on a
# temporary socket, and use it the way a trainer and an operator would:
#   1. read the records once with loaderctl (the built-in benchmark client): that epoch is
#      served from the files while the daemon builds the dataset's single-file cache;
#   2. read them again: from the cache, once the check started at the stream's open has
#      found the files unchanged (`cache info` shows how many samples it served);
#   3. a Python training loop (the headline use) takes JPEG batches as torch tensors;
#   4. show the daemon's status, stop it cleanly and check that nothing is left in /dev/shm.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/bin
lib=${BUILD:-build}/lib
data=${DEMO_DATA:-build/demo-data}
run=$(mktemp -d "${TMPDIR:-/tmp}/loaderd-demo.XXXXXX")
daemon_pid=
log_pid=
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; fi
  rm -rf "$run"
}
trap cleanup EXIT

echo "== generating sample datasets in $data"
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
# The daemon's log goes through sed (to prefix it) in a process substitution; its pid is
# kept so that the demo waits for the last log line before its own closing line.
exec 3> >(sed -u 's/^/  [loaderd] /' >&2)
log_pid=$!
"$bin/loaderd" --config "$run/loaderd.yaml" 2>&3 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$run/loaderd.sock" ] && break; sleep 0.1; done
ctl() { "$bin/loaderctl" --socket "$run/loaderd.sock" "$@"; }

echo "== loaderctl datasets"; ctl datasets
echo "== loaderctl read records (1 epoch, batch 64: from the files, while the cache builds)"
ctl read records --epochs 1 --batch-size 64
for _ in $(seq 300); do ctl cache info records --json | grep -q '"state": *"ready"' && break; sleep 0.1; done
echo "== loaderctl read records again (2 epochs, batch 64: from the cache once the check begun at this open has passed)"
ctl read records --epochs 2 --batch-size 64
echo "== loaderctl cache info records"; ctl cache info records
echo "== loaderctl read tokens (2 epochs, batch 32)"; ctl read tokens --epochs 2 --batch-size 32

echo "== a Python training loop on the images (decode, random resized crop 224, flip)"
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  LOADERD_SOCKET="$run/loaderd.sock" LOADERCLIENT_LIB="$lib/libloaderclient.so" \
    PYTHONPATH=client/python /usr/bin/python3 - <<'PY'
import time
import loaderclient

with loaderclient.Client(name="demo-trainer") as client:
    with client.open("images", batch_size=64, seed=0, epochs=2) as stream:
        t0, n = time.perf_counter(), 0
        for batch in stream:                    # each batch is a zero-copy view of a slot
            try:
                images = batch.torch("image")   # torch uint8[64, 3, 224, 224]
                labels = batch.torch("label")   # torch int64[64]
                mean = images.float().mean().item()
            except ImportError:                 # torch is optional: numpy views work alike
                images, labels = batch["image"], batch["label"]
                mean = float(images.mean())
            n += batch.rows
            if batch.index == 0:
                print(f"  epoch {batch.epoch}: images {tuple(images.shape)} {images.dtype}, "
                      f"labels {tuple(labels.shape)}, mean pixel {mean:.1f}")
        dt = time.perf_counter() - t0
        print(f"  python: {n} images in {dt:.2f} s ({n / dt:,.0f} images/s)")
PY
else
  echo "  (skipped: Debian's python3-numpy is not installed; 'make test' installs it)"
fi
echo "== loaderctl status"; ctl status

echo "== stopping loaderd (SIGTERM)"
kill -TERM "$daemon_pid"
rc=0; wait "$daemon_pid" || rc=$?
daemon_pid=
exec 3>&-
wait "$log_pid" 2>/dev/null || true
left=$(ls /dev/shm | grep -c "^loaderd\." || true)
echo "loaderd exited with status $rc; shared-memory objects left: $left"
[ "$rc" -eq 0 ] && [ "$left" -eq 0 ]
