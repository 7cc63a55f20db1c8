#!/usr/bin/env bash
# The real control plane's binaries, built from the official Go modules at the versions that
# hack/k8s/versions.env pins (the one place they are named):
#   kube-apiserver, kube-controller-manager   k8s.io/kubernetes/cmd/...  (this folder's go.mod)
#   kube-scheduler, kubelet, kube-proxy       the same, for the real node (kubesim/src/kubesim/node.py)
#   etcd                                      go.etcd.io/etcd/server/v3/etcdmain  (etcd/go.mod)
#
#   bash hack/k8s/build.sh        build what is missing; prints the binaries' folder as its last line
#   bash hack/k8s/build.sh dir    print that folder without building
#   bash hack/k8s/build.sh pin    rewrite go.mod, etcd/go.mod and their go.sum from versions.env
#
# The binaries go to ${AGENTRUN_K8S_CACHE:-$HOME/.cache/agentrun/k8s}/<k8s>+etcd<etcd>/, outside
# the work tree, and are reused while all three exist (the script then returns at once). Each is
# written under a temporary name and renamed, so a build cut short leaves no half binary behind,
# and a lock keeps two builds (make and a test fixture) from racing.
#
# Cost, cold (empty module and build caches), on the project's 2-core machine: see README.md here.
# A newer kubernetes may need a newer Go than the machine's; the approved route is
# `export GOTOOLCHAIN=go1.27.3` in every shell that builds (README says so when that day comes).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache_root=${AGENTRUN_K8S_CACHE:-$HOME/.cache/agentrun/k8s}
out="$cache_root/$K8S_VERSION+etcd$ETCD_VERSION"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

die() { echo "hack/k8s/build.sh: $*" >&2; exit 1; }

# kubernetes requires each of its staging modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0 and
# replaces it with a folder of its own tree; the published copies carry the tag v0.<minor>.<patch>.
staging_version() { echo "v0.${K8S_VERSION#v1.}"; }

pin() {
    command -v go >/dev/null || die "go is not on PATH"
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
    [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION's go.mod"
    # Read the list from kubernetes' own go.mod at that tag, never guess it: every k8s.io module it
    # requires at v0.0.0 is a staging module (sample-controller and sample-cli-plugin are replaced
    # there but not required, and not published at every tag).
    local staging go_line godebug
    staging=$(awk '/^require \(/{r=1; next} r && /^\)/{r=0} r && $1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod")
    [[ -n $staging ]] || die "no staging modules found in $gomod"
    go_line=$(awk '$1 == "go" {print $2; exit}' "$gomod")
    godebug=$(awk '$1 == "godebug" {print $2; exit}' "$gomod")
    (
        cd "$here"
        printf 'module agentrun.dev/hack/k8s\n\ngo %s\n' "$go_line" >go.mod
        rm -f go.sum
        [[ -z $godebug ]] || go mod edit -godebug="$godebug"
        go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
        local m
        for m in $staging; do go mod edit -replace="$m=$m@$(staging_version)"; done
        go mod tidy
    )
    (
        cd "$here/etcd"
        printf 'module agentrun.dev/hack/k8s/etcd\n\ngo %s\n' "$go_line" >go.mod
        rm -f go.sum
        go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
        go mod tidy
    )
    echo "pinned k8s.io/kubernetes $K8S_VERSION ($(wc -w <<<"$staging") staging modules at $(staging_version)), etcd $ETCD_VERSION"
}

check_pins() {
    grep -qE "^(require)?\s*k8s\.io/kubernetes $K8S_VERSION\$" "$here/go.mod" ||
        die "hack/k8s/go.mod is not at k8s.io/kubernetes $K8S_VERSION (versions.env): run bash hack/k8s/build.sh pin"
    grep -qE "=> k8s\.io/apiserver $(staging_version)\$" "$here/go.mod" ||
        die "hack/k8s/go.mod does not replace the staging modules with $(staging_version): run bash hack/k8s/build.sh pin"
    grep -qE "^(require)?\s*go\.etcd\.io/etcd/server/v3 $ETCD_VERSION\$" "$here/etcd/go.mod" ||
        die "hack/k8s/etcd/go.mod is not at etcd $ETCD_VERSION (versions.env): run bash hack/k8s/build.sh pin"
}

all_present() {
    local b
    for b in "${binaries[@]}"; do [[ -x $out/$b ]] || return 1; done
}

build_one() {
    local name=$1 moddir=$2 pkg=$3 ldflags=$4 started elapsed
    [[ -x $out/$name ]] && return 0
    started=$(date +%s)
    echo "building $name ($pkg) ..." >&2
    (cd "$moddir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out/.$name.partial" "$pkg")
    mv -f "$out/.$name.partial" "$out/$name"
    elapsed=$(($(date +%s) - started))
    printf '%s\t%s s\t%s bytes\n' "$name" "$elapsed" "$(stat -c %s "$out/$name")" | tee -a "$out/BUILD-INFO" >&2
}

build() {
    if all_present; then
        echo "$out"
        return 0
    fi
    command -v go >/dev/null || die "go is not on PATH; the real control plane is built from source with the Go toolchain"
    check_pins
    mkdir -p "$out"
    exec 9>"$cache_root/.build.lock"
    flock 9
    if all_present; then # another build finished while this one waited
        echo "$out"
        return 0
    fi
    echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores" >>"$out/BUILD-INFO"
    # What kubernetes' own build stamps (hack/lib/version.sh): /version, kubectl version and Helm's
    # kubeVersion checks read it; without it the server says v0.0.0-master.
    local minor=${K8S_VERSION#v1.}
    minor=${minor%%.*}
    local kv="" key val
    for kv in "gitVersion=$K8S_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean \
        "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
        key=${kv%%=*} val=${kv#*=}
        ldflags+=" -X k8s.io/client-go/pkg/version.$key=$val -X k8s.io/component-base/version.$key=$val"
    done
    local total_started
    total_started=$(date +%s)
    build_one etcd "$here/etcd" agentrun.dev/hack/k8s/etcd ""
    build_one kube-apiserver "$here" k8s.io/kubernetes/cmd/kube-apiserver "$ldflags"
    build_one kube-controller-manager "$here" k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags"
    # The real node (tests/node, make node): the scheduler binds pods, the kubelet runs them on containerd,
    # kube-proxy (nftables mode) makes the `kubernetes` Service's ClusterIP reach the API server from pods.
    build_one kube-scheduler "$here" k8s.io/kubernetes/cmd/kube-scheduler "$ldflags"
    build_one kubelet "$here" k8s.io/kubernetes/cmd/kubelet "$ldflags"
    build_one kube-proxy "$here" k8s.io/kubernetes/cmd/kube-proxy "$ldflags"
    echo "# total $(($(date +%s) - total_started)) s" >>"$out/BUILD-INFO"
    echo "$out"
}

ldflags=""
case "${1:-build}" in
build) build ;;
dir) echo "$out" ;;
pin) pin ;;
*) die "usage: build.sh [build|dir|pin]" ;;
esac
