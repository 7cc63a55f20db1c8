#!/usr/bin/env bash
# Install Debian's chromium when /usr/bin/chromium is missing: tests/cluster/test_history_ui.py drives it with
# Playwright for Python (the wheel brings its driver; it launches this browser, nothing is downloaded).
# Without root, or where the package cannot be installed, it says so and the browser test skips (with that reason).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "chromium is missing and installing it needs root: apt-get install -y chromium (the browser test will skip)" >&2
    exit 0
fi
apt-get update -qq
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
    echo "apt-get install chromium failed: the browser test will skip" >&2
fi
exit 0
