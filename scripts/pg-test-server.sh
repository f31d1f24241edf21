#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests and the benchmark of the `sql` kind:
# Debian's server binaries (package postgresql), a cluster made by initdb in DIR, reached
# only through a Unix socket in DIR (no TCP), with one role `loaderd` whose password is
# checked (scram-sha-256). Run as root, the server runs as `nobody` (initdb refuses root).
#
#   scripts/pg-test-server.sh start DIR PASSWORD   initdb and start; prints the connection
#                                                  string, without the password
#   scripts/pg-test-server.sh up DIR               start again after a stop
#   scripts/pg-test-server.sh stop DIR             stop at once (-m immediate: as a crash)
#
# The server's log is DIR/server.log; PG_TEST_OPTIONS adds server options (e.g.
# "-c log_statement=all"). Exits 2, saying so, when the server binaries are not installed,
# so that a caller can skip with that message.
set -euo pipefail
cmd=${1:?usage: pg-test-server.sh start|up|stop DIR [PASSWORD]}
dir=${2:?usage: pg-test-server.sh start|up|stop DIR [PASSWORD]}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "pg-test-server: no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)" >&2
  exit 2
fi
as=()
if [ "$(id -u)" = 0 ]; then as=(runuser -u nobody --); fi
cd "$dir"   # the server's user may not read the caller's directory
case $cmd in
  start)
    pw=${3:?pg-test-server.sh start needs a password}
    chmod 700 "$dir"
    if [ ${#as[@]} -gt 0 ]; then
      chown nobody: "$dir"
      if ! "${as[@]}" test -x "$dir"; then
        echo "pg-test-server: user nobody cannot reach $dir (a folder above it is private): use a folder of its own" >&2
        exit 1
      fi
    fi
    (umask 077 && printf '%s\n' "$pw" > "$dir/pw")
    if [ ${#as[@]} -gt 0 ]; then chown nobody: "$dir/pw"; fi
    if ! "${as[@]}" "$bin/initdb" -D "$dir/data" -U loaderd --pwfile="$dir/pw" -A scram-sha-256 --no-sync \
         -E UTF8 --locale=C >"$dir/initdb.log" 2>&1; then
      cat "$dir/initdb.log" >&2
      exit 1
    fi
    rm -f "$dir/pw"
    ;;
  up) ;;
  stop)
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
    exit 0 ;;
  *) echo "pg-test-server: unknown command $cmd" >&2; exit 64 ;;
esac
if ! "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
     -o "-k $dir -c listen_addresses= -F ${PG_TEST_OPTIONS:-}" start >/dev/null; then
  tail -n 20 "$dir/server.log" >&2
  exit 1
fi
echo "host=$dir dbname=postgres user=loaderd"
