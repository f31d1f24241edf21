#!/usr/bin/env bash
# Checks the systemd units as `make install-systemd` installs them:
#   - systemd-analyze verify passes on loaderd.service and loaderd.socket;
#   - systemd-analyze security rates the service at most 2.5;
#   - the socket unit listens in the service's runtime directory, which the service
#     keeps on stop (RuntimeDirectoryPreserve=yes), and the service has writable cache
#     and state directories under ProtectSystem=strict;
#   - a reload sends loaderd SIGHUP: ExecReload= kills -HUP $MAINPID (Type=notify), or
#     Type=notify-reload does it itself;
#   - the GPU hosts' drop-in is shipped, applied only on request, and with it the unit
#     verifies, sees the NVIDIA device nodes and stays within the exposure bound;
#   - systemd-sysusers creates the loaderd user and group from the sysusers.d entry,
#     and systemd-tmpfiles creates /run/loaderd 0750 loaderd:loaderd, in a scratch root.
# None of this needs a running systemd. A check whose tool is missing is skipped, saying
# so. Prints "systemd units: P passed, F failed, S skipped" last; exit 1 on a failure.
#   tests/systemd/check-units.sh BUILD_DIR
set -uo pipefail
build=${1:-build}
passed=0; failed=0; skipped=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }
skip() { echo "skipped: $*"; skipped=$((skipped + 1)); }
finish() { echo "systemd units: $passed passed, $failed failed, $skipped skipped"; [ "$failed" -eq 0 ]; exit $?; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
# Installed with a prefix of its own, the unit's ExecStart= names a binary that exists
# (verify checks it).
if ! make --no-print-directory -s install-systemd PREFIX="$prefix" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"; bad "make install-systemd"; finish
fi
mkdir -p "$prefix/bin"
if [ -x "$build/bin/loaderd" ]; then
  cp "$build/bin/loaderd" "$prefix/bin/loaderd"
else
  printf '#!/bin/sh\nexit 0\n' >"$prefix/bin/loaderd"; chmod +x "$prefix/bin/loaderd"
fi
units=$prefix/lib/systemd/system
service=$units/loaderd.service
socket=$units/loaderd.socket
for f in "$service" "$socket" "$prefix/lib/sysusers.d/loaderd.conf" "$prefix/lib/tmpfiles.d/loaderd.conf"; do
  [ -f "$f" ] && ok "installed ${f#$prefix/}" || bad "not installed: ${f#$prefix/}"
done
grep -q "^ExecStart=$prefix/bin/loaderd " "$service" && ok "ExecStart= follows PREFIX" \
  || bad "ExecStart= does not name $prefix/bin/loaderd: $(grep ^ExecStart= "$service")"

if command -v systemd-analyze >/dev/null 2>&1; then
  if out=$(systemd-analyze verify "$service" "$socket" 2>&1) && [ -z "$out" ]; then
    ok "systemd-analyze verify"
  else
    bad "systemd-analyze verify: $out"
  fi
  out=$(systemd-analyze security --offline=yes "$service" 2>&1)
  score=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for loaderd.service: \([0-9.]*\).*/\1/p')
  if [ -z "$score" ]; then
    bad "systemd-analyze security gave no score: $(printf '%s\n' "$out" | tail -3)"
  elif awk -v s="$score" 'BEGIN {exit !(s <= 2.5)}'; then
    ok "systemd-analyze security: exposure $score (at most 2.5)"
  else
    printf '%s\n' "$out" | grep '✗'
    bad "systemd-analyze security: exposure $score, more than 2.5"
  fi
else
  skip "systemd-analyze verify and security: systemd-analyze is not installed (Debian package systemd)"
fi

# The GPU hosts' drop-in: shipped by every install, applied only with GPU_DROPIN=yes;
# with it the unit still verifies, sees the NVIDIA devices (and no others) and stays
# within the exposure bound.
gpu_conf=$prefix/share/loaderd/systemd/loaderd-gpu.conf
[ -f "$gpu_conf" ] && ok "installed share/loaderd/systemd/loaderd-gpu.conf" || bad "not installed: share/loaderd/systemd/loaderd-gpu.conf"
[ ! -e "$units/loaderd.service.d/gpu.conf" ] && ok "the GPU drop-in is not applied by default" \
  || bad "the GPU drop-in is applied without GPU_DROPIN=yes"
gprefix=$tmp/gpu-prefix
if make --no-print-directory -s install-systemd PREFIX="$gprefix" GPU_DROPIN=yes >"$tmp/install-gpu.log" 2>&1 \
   && [ -f "$gprefix/lib/systemd/system/loaderd.service.d/gpu.conf" ]; then
  ok "make install-systemd GPU_DROPIN=yes installs loaderd.service.d/gpu.conf"
  mkdir -p "$gprefix/bin" && cp "$prefix/bin/loaderd" "$gprefix/bin/loaderd"
  if command -v systemd-analyze >/dev/null 2>&1; then
    gservice=$gprefix/lib/systemd/system/loaderd.service
    if out=$(systemd-analyze verify "$gservice" "$gprefix/lib/systemd/system/loaderd.socket" 2>&1) && [ -z "$out" ]; then
      ok "systemd-analyze verify with the GPU drop-in"
    else
      bad "systemd-analyze verify with the GPU drop-in: $out"
    fi
    out=$(systemd-analyze security --offline=yes "$gservice" 2>&1)
    acl=$(printf '%s\n' "$out" | grep 'DeviceAllow=')
    if printf '%s\n' "$out" | grep -q '✗ PrivateDevices=' && printf '%s\n' "$acl" | grep -q '/dev/nvidiactl:rw' \
       && printf '%s\n' "$acl" | grep -q 'char-nvidia-frontend:rw' && printf '%s\n' "$acl" | grep -q 'char-nvidia-uvm:rw'; then
      ok "with the GPU drop-in the service sees /dev/nvidia* (PrivateDevices=no, DeviceAllow= for the NVIDIA nodes)"
    else
      bad "the GPU drop-in is not in effect: $(printf '%s\n' "$out" | grep -E 'PrivateDevices=|DeviceAllow=')"
    fi
    gscore=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for loaderd.service: \([0-9.]*\).*/\1/p')
    if [ -n "$gscore" ] && awk -v s="$gscore" 'BEGIN {exit !(s <= 2.5)}'; then
      ok "systemd-analyze security with the GPU drop-in: exposure $gscore (at most 2.5)"
    else
      bad "systemd-analyze security with the GPU drop-in: exposure ${gscore:-?}, more than 2.5"
    fi
  else
    skip "the GPU drop-in: systemd-analyze is not installed"
  fi
else
  cat "$tmp/install-gpu.log"; bad "make install-systemd GPU_DROPIN=yes did not install loaderd.service.d/gpu.conf"
fi

# The units agree with each other (what verify cannot see).
key() { sed -n "s/^$1=//p" "$2" | tail -1; }
listen=$(key ListenStream "$socket")
rundir=$(key RuntimeDirectory "$service")
[ "$(dirname "$listen")" = "/run/$rundir" ] && ok "socket $listen is in the service's RuntimeDirectory=$rundir" \
  || bad "socket $listen is not in /run/$rundir"
[ "$(key RuntimeDirectoryPreserve "$service")" = yes ] && ok "RuntimeDirectoryPreserve=yes: stopping the service keeps the socket's directory" \
  || bad "the service removes /run/$rundir on stop (no RuntimeDirectoryPreserve=yes)"
[ "$(key ProtectSystem "$service")" = strict ] && ok "ProtectSystem=strict" || bad "ProtectSystem is not strict"
[ -n "$(key CacheDirectory "$service")" ] && [ -n "$(key StateDirectory "$service")" ] \
  && ok "CacheDirectory= and StateDirectory= are writable under ProtectSystem=strict" \
  || bad "no CacheDirectory= or StateDirectory="
reload=$(key ExecReload "$service")
case "$(key Type "$service"):$reload" in
  notify-reload:) ok "Type=notify-reload: systemd sends SIGHUP and waits for READY=1" ;;
  notify:*kill\ -HUP\ \$MAINPID) ok "ExecReload=$reload: a reload is SIGHUP, bracketed by RELOADING=1/READY=1" ;;
  *) bad "no reload that sends SIGHUP (Type=$(key Type "$service"), ExecReload=$reload)" ;;
esac
[ "$(key User "$service")" = loaderd ] && [ "$(key SocketGroup "$socket")" = loaderd ] \
  && ok "the service runs as loaderd; the socket belongs to group loaderd" || bad "User=/SocketGroup= are not loaderd"

# The sysusers.d and tmpfiles.d entries, applied to a scratch root.
root=$tmp/root
mkdir -p "$root/etc"
if command -v systemd-sysusers >/dev/null 2>&1; then
  if systemd-sysusers --root="$root" "$prefix/lib/sysusers.d/loaderd.conf" >"$tmp/sysusers.log" 2>&1 \
     && grep -q '^loaderd:' "$root/etc/passwd" && grep -q '^loaderd:' "$root/etc/group"; then
    uid=$(awk -F: '$1 == "loaderd" {print $3}' "$root/etc/passwd")
    gid=$(awk -F: '$1 == "loaderd" {print $4}' "$root/etc/passwd")
    [ "$(awk -F: '$1 == "loaderd" {print $3}' "$root/etc/group")" = "$gid" ] && [ "$uid" -lt 1000 ] \
      && ok "systemd-sysusers creates system user loaderd ($uid) with group loaderd ($gid)" \
      || bad "sysusers: user loaderd ($uid) is not a system user of group loaderd"
  else
    cat "$tmp/sysusers.log"; bad "systemd-sysusers did not create loaderd"
  fi
else
  skip "sysusers.d entry: systemd-sysusers is not installed"
fi
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && grep -q '^loaderd:' "$root/etc/passwd" 2>/dev/null; then
  if systemd-tmpfiles --root="$root" --create "$prefix/lib/tmpfiles.d/loaderd.conf" >"$tmp/tmpfiles.log" 2>&1 \
     && [ "$(stat -c %a "$root/run/loaderd")" = 750 ] && [ "$(stat -c %u "$root/run/loaderd")" = "$uid" ] \
     && [ "$(stat -c %g "$root/run/loaderd")" = "$gid" ]; then
    ok "systemd-tmpfiles creates /run/loaderd 0750 loaderd:loaderd"
  else
    cat "$tmp/tmpfiles.log"; ls -ld "$root/run/loaderd" 2>&1; bad "systemd-tmpfiles did not create /run/loaderd as it should"
  fi
else
  skip "tmpfiles.d entry: needs systemd-tmpfiles, root (to chown) and the sysusers check"
fi
finish
