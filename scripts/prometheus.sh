#!/usr/bin/env bash
# Install Debian's prometheus package when /usr/bin/prometheus is missing (tests/cluster/test_metrics_prometheus.py
# starts it itself, with a temporary config and data directory on a loopback port). The package's own service
# must not start: policy-rc.d refuses service starts during the install, and it is removed afterwards.
set -euo pipefail
if [ -x /usr/bin/prometheus ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "prometheus is missing and installing it needs root: apt-get install -y prometheus" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
test -x /usr/bin/prometheus
