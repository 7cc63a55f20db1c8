#!/usr/bin/env bash
# Install (when missing), configure and start the local PostgreSQL and Redis that the tests and the demo use.
# Works on a fresh machine with nothing done by hand: Debian's postgresql and redis-server packages, loopback
# only, trust authentication for 127.0.0.1 and ::1 (the tests connect as postgres without a password), no
# package service left to systemd (there is none here): both servers are started directly and kept running.
set -euo pipefail

# The newest PostgreSQL major version whose server is installed (a client package alone also makes
# /usr/lib/postgresql/N, and postgresql-common's pg_ctlcluster can be there without any server).
server_version() { ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null | cut -d/ -f5 | sort -V | tail -n1; }
missing=()
{ [ -n "$(server_version)" ] && command -v pg_ctlcluster >/dev/null; } || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] || { echo "installing ${missing[*]}"; bash "$(dirname "$0")/apt_install.sh" "${missing[@]}"; }
# PgBouncer: installed only, never started as a service (tests and the bench start their own process).
bash "$(dirname "$0")/pgbouncer.sh"

# PostgreSQL: the newest installed major version's "main" cluster, created when absent.
version="$(server_version)"
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$version main"; then
    pg_createcluster "$version" main >/dev/null
fi
conf=/etc/postgresql/$version/main
marker="# agentrun: loopback trust (scripts/services.sh)"
if ! grep -qF "$marker" "$conf/pg_hba.conf"; then
    # First matching line wins: put the loopback trust lines before the package's scram lines.
    { echo "$marker"
      echo "host    all             all             127.0.0.1/32            trust"
      echo "host    all             all             ::1/128                 trust"
      echo "host    replication     all             127.0.0.1/32            trust"
      cat "$conf/pg_hba.conf"; } >"$conf/pg_hba.conf.new"
    mv "$conf/pg_hba.conf.new" "$conf/pg_hba.conf"
    chown postgres:postgres "$conf/pg_hba.conf"
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload 2>/dev/null || true
fi
mkdir -p "$conf/conf.d"
# Loopback only, on 5432 (pg_createcluster takes the next free port, 5433, when 5432 was busy as the cluster was
# made, and the tests connect to 5432); room for the cluster tier's runner pods (each a pool plus a LISTEN
# connection); no TLS on loopback (Debian's cluster has ssl = on with a snakeoil cert: clients would pay a
# handshake per connection and the benchmarks would measure TLS).
settings="listen_addresses = 'localhost'
port = 5432
max_connections = 300
ssl = off"
if [ "$(cat "$conf/conf.d/agentrun.conf" 2>/dev/null)" != "$settings" ]; then
    printf '%s\n' "$settings" >"$conf/conf.d/agentrun.conf"
    pg_ctlcluster --skip-systemctl-redirect "$version" main restart 2>/dev/null || true
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
    echo "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/agentrun.log
    for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 -q || { echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2; exit 1; }
psql -h 127.0.0.1 -U postgres -Atc 'select 1' postgres >/dev/null \
    || { echo "PostgreSQL refuses postgres@127.0.0.1 without a password (pg_hba.conf)" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }
