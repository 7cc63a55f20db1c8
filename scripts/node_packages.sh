#!/usr/bin/env bash
# Install what the real node (kubesim.node, make node, tests/node) runs besides the binaries built by
# hack/k8s/build.sh: Debian's containerd (1.6) and runc (1.1), the CNI plugins (bridge, host-local,
# loopback in /usr/lib/cni) and nftables (the nft program kube-proxy's nftables mode runs), when one is
# missing. Their services must not start (there is no init system, and the node runs a containerd of its own
# with its own config, socket and root): apt_install.sh refuses service starts during the install.
set -euo pipefail
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v nft >/dev/null || missing+=(nftables)
if [ ${#missing[@]} -gt 0 ]; then
    bash "$(dirname "$0")/apt_install.sh" "${missing[@]}"
fi
command -v containerd >/dev/null && command -v runc >/dev/null && [ -x /usr/lib/cni/bridge ] && command -v nft >/dev/null
