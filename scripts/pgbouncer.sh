#!/usr/bin/env bash
# Install Debian's pgbouncer package when /usr/sbin/pgbouncer is missing. Tests and the bench start their own
# pgbouncer process (agentrun.devservers.PrivatePgBouncer: a temporary config, pool_mode=transaction, a free
# loopback port); the package's own service must not start: policy-rc.d refuses service starts during the
# install, and it is removed afterwards. Called by scripts/services.sh.
set -euo pipefail
if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "pgbouncer is missing and installing it needs root: apt-get install -y pgbouncer" >&2
    exit 1
fi
policy=/usr/sbin/policy-rc.d
created=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created=1
fi
trap '[ "$created" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
test -x /usr/sbin/pgbouncer
