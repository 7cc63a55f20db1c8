#!/usr/bin/env bash
# Install Debian packages (arguments) as root without starting their services: there is no init system here,
# and tests start their own server processes. policy-rc.d refuses service starts during the install and is
# removed afterwards. Used by services.sh, prometheus.sh and pgbouncer.sh.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
    echo "missing $*; installing it needs root: apt-get install -y $*" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
