#!/usr/bin/env bash
# Install Debian's pgbouncer package when /usr/sbin/pgbouncer is missing. Tests and the bench start their own
# pgbouncer process (agentrun_dev.servers.PrivatePgBouncer: a temporary config, pool_mode=transaction, a free
# loopback port); the package's own service must not start: policy-rc.d refuses service starts during the
# install, and it is removed afterwards. Called by scripts/services.sh.
set -euo pipefail
if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" pgbouncer
test -x /usr/sbin/pgbouncer
