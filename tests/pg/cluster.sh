#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests: `start DIR [PORT]` runs initdb and pg_ctl (as the
# `postgres` user when run as root: PostgreSQL refuses to run as root) with the data, socket and
# log in DIR, listening on 127.0.0.1:PORT (default 55432), trust authentication (loopback only),
# TLS on with a CA of its own (DIR/ca.crt), and prints the URL the tests read from
# BC_TEST_POSTGRES. `stop DIR` stops it, `resume DIR` starts it again, `restart DIR` does both
# (tests/e2e/tests/postgres.rs stops the database under a running control plane with these).
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop|resume|restart DIR [PORT]}
dir=${2:?usage: cluster.sh start|stop|resume|restart DIR [PORT]}
port=${3:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "cluster.sh: PostgreSQL server binaries not found under /usr/lib/postgresql (Debian package postgresql)" >&2
  exit 1
fi
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
pg_start() {
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=300 \
        -c ssl=on -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key" start >/dev/null
}
case "$cmd" in
  start)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_pg "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C >"$dir/initdb.log"
    fi
    echo "$port" >"$dir/port"
    # TLS: a CA of its own ($dir/ca.crt, for the tests' sslrootcert) and a server certificate
    # for localhost and 127.0.0.1.
    if [ ! -f "$dir/server.crt" ]; then
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=bc test postgres CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
      printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$dir/san.ext"
      openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 30 -extfile "$dir/san.ext" -out "$dir/server.crt" 2>/dev/null
      chmod 600 "$dir/server.key"
    fi
    [ "$(id -u)" = 0 ] && chown postgres: "$dir/port" "$dir/server.key" "$dir/server.crt"
    pg_start
    echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
    ;;
  stop)
    as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    ;;
  restart)
    port=$(cat "$dir/port")
    as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    pg_start
    ;;
  resume)
    port=$(cat "$dir/port")
    pg_start
    ;;
  *)
    echo "usage: cluster.sh start|stop|resume|restart DIR [PORT]" >&2
    exit 2
    ;;
esac
