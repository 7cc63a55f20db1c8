#!/usr/bin/env bash
# End-to-end tests on a real Kubernetes cluster (kind): `make e2e-kind`.
#
# Creates (or reuses) a kind cluster, builds the one agentrun image, loads it into kind,
# installs the CRD, the operator (deploy/operator.yaml with the image substituted) and the
# throwaway store (deploy/dev-store.yaml), port-forwards the store's PostgreSQL so the
# tests can read what the cluster did, and runs `pytest tests/e2e` against it.
#
# Needs: docker (a running engine), kind, kubectl, and `make dev` done. Environment:
#   KIND_CLUSTER   cluster name (default agentrun-e2e); an existing one is reused and kept
#   KEEP_CLUSTER=1 keep a cluster this script created (default: delete it at the end)
#   IMAGE          image tag to build and load (default agentrun:e2e)
#   PYTEST         pytest to run (default .venv/bin/pytest)
# Extra arguments go to pytest, e.g.  hack/e2e-kind.sh -k eviction -x
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${KIND_CLUSTER:-agentrun-e2e}"
IMAGE="${IMAGE:-agentrun:e2e}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
PYTEST="${PYTEST:-$ROOT/.venv/bin/pytest}"
PYTHON="$(dirname "$PYTEST")/python"
# The image reference deploy/operator.yaml ships with (the operator's image and its default
# runner image, AGENTRUN_OPERATOR_DEFAULT_IMAGE); both are replaced by IMAGE.
MANIFEST_IMAGE="ghcr.io/agentrun/agentrun:0.1.0"
SYSTEM_NS="agentrun-system"

log() { printf 'e2e-kind: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed or not on PATH; $2"; }

need docker "install Docker: https://docs.docker.com/get-docker/"
need kind "install kind: https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "install kubectl: https://kubernetes.io/docs/tasks/tools/"
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

diagnostics() {
    log "diagnostics (the run failed):"
    kc get agentruns,pods -A -o wide || true
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
            service/agentrun-postgres "$PG_PORT:5432" >>"$PF_LOG" 2>&1 &
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

log "building $IMAGE"
docker build -t "$IMAGE" "$ROOT"
log "loading $IMAGE into kind"
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "installing the CRD"
# Server-side: a CRD with a full schema can outgrow the last-applied annotation of a client-side apply.
kc apply --server-side --force-conflicts -f "$ROOT/crds/"
kc wait --for=condition=Established crd/agentruns.agentrun.dev --timeout=60s

log "installing the operator (image $IMAGE)"
manifest="$(<"$ROOT/deploy/operator.yaml")"
[[ "$manifest" == *"$MANIFEST_IMAGE"* ]] || die "deploy/operator.yaml no longer refers to $MANIFEST_IMAGE; update MANIFEST_IMAGE here"
# imagePullPolicy is IfNotPresent in the manifest (operator and runner pods), which is what a
# kind-loaded image needs: the node must not try to pull agentrun:e2e from a registry.
printf '%s\n' "${manifest//"$MANIFEST_IMAGE"/"$IMAGE"}" | kc apply -f -

log "installing the throwaway store"
kc apply -f "$ROOT/deploy/dev-store.yaml"

log "waiting for rollouts (first image pulls can take minutes)"
for deployment in agentrun-postgres agentrun-redis agentrun-operator; do
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
