#!/usr/bin/env bash
# Builds the Debian package from the working tree (dpkg-buildpackage -us -uc in a
# scratch copy of the files git knows or would add, so nothing is written next to the
# repository) and checks it without
# installing it on this machine: its version is VERSION's, it holds the daemon, the
# library and the units, its postinst creates the user before /run/loaderd, and the
# packaged daemon, run from the unpacked package with the packaged config (paths moved
# into the scratch root), serves its example dataset, answers `loaderctl metrics` and
# stops cleanly. Exit 0: passed, 1: failed, 2: a tool is missing (the check is skipped).
#   tests/systemd/check-deb.sh
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
for tool in dpkg-buildpackage dh systemd-sysusers systemd-tmpfiles; do
  command -v "$tool" >/dev/null || { echo "check-deb: $tool is missing (apt-get install dpkg-dev debhelper systemd)"; exit 2; }
done
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "check-deb: FAILED: $*"; exit 1; }

version=$(cat "$repo/VERSION")
deb_version=$(dpkg-parsechangelog -l "$repo/debian/changelog" -S Version)
[ "$deb_version" = "$version" ] || fail "debian/changelog says $deb_version, VERSION says $version"

mkdir -p "$tmp/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -x -C "$tmp/src"
(cd "$tmp/src" && dpkg-buildpackage -us -uc -j"$(nproc)" >"$tmp/build.log" 2>&1) || { tail -40 "$tmp/build.log"; fail "dpkg-buildpackage"; }
deb=$tmp/loaderd_${version}_$(dpkg --print-architecture).deb
[ -f "$deb" ] || fail "no $deb"
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/loaderd ./usr/bin/loaderctl ./usr/lib/libloaderclient.so.$version ./usr/include/loaderclient.h \
         ./usr/lib/pkgconfig/loaderclient.pc ./lib/systemd/system/loaderd.service ./lib/systemd/system/loaderd.socket \
         ./usr/lib/sysusers.d/loaderd.conf ./usr/lib/tmpfiles.d/loaderd.conf ./etc/loaderd/loaderd.yaml; do
  grep -qx "$f" <<<"$contents" || fail "the package lacks $f"
done
echo "ok: package contents"
dpkg-deb -e "$deb" "$tmp/ctrl"
grep -qx /etc/loaderd/loaderd.yaml "$tmp/ctrl/conffiles" || fail "/etc/loaderd/loaderd.yaml is not a conffile"
users=$(grep -n 'systemd-sysusers' "$tmp/ctrl/postinst" | head -1 | cut -d: -f1)
dirs=$(grep -n 'systemd-tmpfiles' "$tmp/ctrl/postinst" | head -1 | cut -d: -f1)
[ -n "$users" ] && [ -n "$dirs" ] && [ "$users" -lt "$dirs" ] || fail "postinst does not create the user before /run/loaderd"
grep -q "deb-systemd-invoke .*loaderd.service" "$tmp/ctrl/postinst" || fail "postinst does not start loaderd.service"
echo "ok: postinst creates the user, then /run/loaderd, then enables and starts the units"

root=$tmp/root
dpkg-deb -x "$deb" "$root"
mkdir -p "$root/etc" "$root/run"
systemd-sysusers --root="$root" loaderd.conf >/dev/null 2>&1
grep -q '^loaderd:' "$root/etc/passwd" || fail "sysusers did not create loaderd"
sock=$root/run/loaderd/loaderd.sock
mkdir -p "$root/run/loaderd"
sed -e "s|/run/loaderd/loaderd.sock|$sock|" -e "s|/usr/share/doc/loaderd|$root/usr/share/doc/loaderd|" \
    -e "s|socket_group: loaderd|# socket_group: loaderd|" "$root/etc/loaderd/loaderd.yaml" >"$tmp/loaderd.yaml"
"$root/usr/bin/loaderd" --config "$tmp/loaderd.yaml" --check >/dev/null || fail "loaderd --check on the packaged config"
"$root/usr/bin/loaderd" --config "$tmp/loaderd.yaml" >"$tmp/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
ctl() { LD_LIBRARY_PATH="$root/usr/lib" "$root/usr/bin/loaderctl" --socket "$sock" "$@"; }
ctl read example --epochs 1 --batch-size 1 >/dev/null || { cat "$tmp/daemon.log"; fail "loaderctl read example"; }
served=$(ctl metrics | sed -n 's/^loaderd_samples_served_total //p')
[ "${served:-0}" -gt 0 ] || fail "loaderctl metrics shows no samples served"
kill -TERM "$pid"
wait "$pid" || { cat "$tmp/daemon.log"; fail "the packaged daemon did not stop cleanly"; }
pid=
[ ! -e "$sock" ] || fail "the socket was left behind"
echo "ok: the packaged daemon serves its example dataset ($served samples), answers metrics and stops cleanly"
echo "check-deb: passed"
