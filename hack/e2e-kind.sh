#!/usr/bin/env bash
# End-to-end tests on a real Kubernetes cluster (kind): `make e2e-kind`.
#
# Creates (or reuses) a kind cluster, builds the agentrun image's `demo` target (the runtime
# image plus examples/, which the tests' AgentRuns run), loads it into kind, installs the CRD
# and then the Helm chart helm/agentrun with its throwaway dev store (devStore.enabled: a
# password-less PostgreSQL and Redis, never for anything real), port-forwards the store's
# PostgreSQL so the tests can read what the cluster did, and runs `pytest tests/e2e` against it.
#
# Needs: docker (a running engine), kind, kubectl, helm (v3.8+ or v4), and `make dev` done.
# Environment:
#   KIND_CLUSTER   cluster name (default agentrun-e2e); an existing one is reused and kept
#   KEEP_CLUSTER=1 keep a cluster this script created (default: delete it at the end)
#   IMAGE          image reference REPOSITORY:TAG to build and load (default agentrun:e2e)
#   PYTEST         pytest to run (default .venv/bin/pytest)
# Extra arguments go to pytest, e.g.  hack/e2e-kind.sh -k eviction -x
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${KIND_CLUSTER:-agentrun-e2e}"
IMAGE="${IMAGE:-agentrun:e2e}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
PYTEST="${PYTEST:-$ROOT/.venv/bin/pytest}"
PYTHON="$(dirname "$PYTEST")/python"
CHART="$ROOT/helm/agentrun"
RELEASE="agentrun"
SYSTEM_NS="agentrun-system"
# The chart takes the image as repository and tag (image.repository, image.tag); it is both the
# operator's image and the default runner image (AGENTRUN_OPERATOR_DEFAULT_IMAGE).
IMAGE_REPOSITORY="${IMAGE%:*}"
IMAGE_TAG="${IMAGE##*:}"

log() { printf 'e2e-kind: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed or not on PATH; $2"; }

need docker "install Docker: https://docs.docker.com/get-docker/"
need kind "install kind: https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "install kubectl: https://kubernetes.io/docs/tasks/tools/"
need helm "install Helm: https://helm.sh/docs/intro/install/"
[[ "$IMAGE" == *:* && -n "$IMAGE_REPOSITORY" && "$IMAGE_TAG" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] \
    || die "IMAGE must be REPOSITORY:TAG (got '$IMAGE')"
[[ -x "$PYTEST" && -x "$PYTHON" ]] || die "no pytest/python next to $PYTEST; run 'make dev' first (or set PYTEST)"
docker info >/dev/null 2>&1 || die "docker is installed but its engine is not reachable (is the daemon running? may this user use it?)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agentrun-e2e.XXXXXX")"
KUBECONFIG_FILE="$WORK/kubeconfig"
PF_LOG="$WORK/port-forward.log"
PF_PID=""
CREATED=0

# Every kubectl call names the kind cluster's kubeconfig: the user's own kubeconfig and
# current context are never read or changed.
kc() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }
hc() { helm --kubeconfig "$KUBECONFIG_FILE" "$@"; }

diagnostics() {
    log "diagnostics (the run failed):"
    kc get agentruns,pods -A -o wide || true
    hc -n "$SYSTEM_NS" status "$RELEASE" || true
    kc -n "$SYSTEM_NS" get deployments,pods,leases -o wide || true
    kc -n "$SYSTEM_NS" logs -l app.kubernetes.io/name=agentrun-operator --all-containers --prefix --tail=200 || true
    kc get events -A --sort-by=.lastTimestamp | tail -n 60 || true
}

cleanup() {
    local status=$?
    trap - EXIT
    if [[ -n "$PF_PID" ]]; then
        kill "$PF_PID" 2>/dev/null || true
        wait "$PF_PID" 2>/dev/null || true
    fi
    if [[ "$status" -ne 0 && -s "$KUBECONFIG_FILE" ]]; then
        diagnostics
    fi
    if [[ "$CREATED" -eq 1 && "$KEEP_CLUSTER" != "1" ]]; then
        log "deleting kind cluster $CLUSTER (KEEP_CLUSTER=1 keeps it)"
        kind delete cluster --name "$CLUSTER" || true
    elif kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
        log "kept kind cluster $CLUSTER; use it with: kind export kubeconfig --name $CLUSTER"
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT

# kubectl port-forward ends when a forwarded connection breaks or the pod is replaced; the
# tests open many connections over several minutes, so keep one running on a fixed port.
forward_postgres() {
    local child=""
    trap 'if [[ -n "$child" ]]; then kill "$child" 2>/dev/null || true; fi; exit 0' TERM
    while true; do
        kubectl --kubeconfig "$KUBECONFIG_FILE" -n "$SYSTEM_NS" port-forward --address 127.0.0.1 \
            service/"$RELEASE"-postgres "$PG_PORT:5432" >>"$PF_LOG" 2>&1 &
        child=$!
        wait "$child" || true
        echo "port-forward ended; restarting it" >>"$PF_LOG"
        sleep 1
    done
}

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "reusing kind cluster $CLUSTER (it is kept afterwards)"
else
    log "creating kind cluster $CLUSTER"
    CREATED=1
    kind create cluster --name "$CLUSTER" --wait 180s
fi
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"

log "building $IMAGE (target demo: the runtime image plus examples/)"
docker build --target demo -t "$IMAGE" "$ROOT"
log "loading $IMAGE into kind"
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "installing the CRD"
# Before the chart, and on every run: Helm installs a chart's crds/ on first install only and
# never upgrades them, so a reused cluster would keep an old schema. Server-side: a CRD with a
# full schema can outgrow the last-applied annotation of a client-side apply.
kc apply --server-side --force-conflicts -f "$ROOT/crds/"
kc wait --for=condition=Established crd/agentruns.agentrun.dev --timeout=60s

log "preparing namespace $SYSTEM_NS (restricted Pod Security, enforced)"
kc create namespace "$SYSTEM_NS" --dry-run=client -o yaml | kc apply -f -
kc label namespace "$SYSTEM_NS" --overwrite \
    pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest \
    pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/audit=restricted

log "installing the chart (release $RELEASE, image $IMAGE, dev store on)"
# A cluster reused from before the chart (objects applied from deploy/ by kubectl) makes Helm
# refuse to adopt them ("invalid ownership metadata"): delete that cluster, or those objects.
# imagePullPolicy IfNotPresent (operator and runner pods) is what a kind-loaded image needs:
# the node must not try to pull $IMAGE from a registry. The dev store's Secret lands in
# "default", where the tests create their AgentRuns.
hc upgrade --install "$RELEASE" "$CHART" --namespace "$SYSTEM_NS" \
    --set-string image.repository="$IMAGE_REPOSITORY" --set-string image.tag="$IMAGE_TAG" \
    --set image.pullPolicy=IfNotPresent \
    --set devStore.enabled=true --set 'devStore.secretNamespaces={default}' \
    --wait --timeout 600s
if [[ "$CREATED" -eq 0 ]]; then
    # Same tag, possibly a new image: make the operator pods start from what was just loaded.
    kc -n "$SYSTEM_NS" rollout restart deployment/"$RELEASE"-operator
fi

log "waiting for rollouts (first image pulls can take minutes)"
for deployment in "$RELEASE"-postgres "$RELEASE"-redis "$RELEASE"-operator; do
    kc -n "$SYSTEM_NS" rollout status "deployment/$deployment" --timeout=600s
done

PG_PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log "port-forwarding the cluster's PostgreSQL to 127.0.0.1:$PG_PORT"
forward_postgres &
PF_PID=$!
for _ in $(seq 1 60); do
    if (: <"/dev/tcp/127.0.0.1/$PG_PORT") 2>/dev/null; then
        break
    fi
    sleep 1
done
(: <"/dev/tcp/127.0.0.1/$PG_PORT") 2>/dev/null || die "the port-forward never opened: $(cat "$PF_LOG")"

log "running the end-to-end tests"
cd "$ROOT"
AGENTRUN_E2E_KUBECONFIG="$KUBECONFIG_FILE" \
AGENTRUN_E2E_POSTGRES_DSN="postgresql://postgres@127.0.0.1:$PG_PORT/agentrun" \
AGENTRUN_E2E_KIND_CLUSTER="$CLUSTER" \
    "$PYTEST" -q -rs tests/e2e "$@"
