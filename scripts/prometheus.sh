#!/usr/bin/env bash
# Install Debian's prometheus package when /usr/bin/prometheus is missing (tests/cluster/test_metrics_prometheus.py
# starts it itself, with a temporary config and data directory on a loopback port). The package's own service
# must not start: policy-rc.d refuses service starts during the install, and it is removed afterwards.
set -euo pipefail
if [ -x /usr/bin/prometheus ]; then
    exit 0
fi
bash "$(dirname "$0")/apt_install.sh" prometheus
test -x /usr/bin/prometheus
