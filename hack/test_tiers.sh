#!/usr/bin/env bash
# make test: the cluster tier (tests/cluster) in a pytest of its own beside every other tier.
#
# Why two at once: measured in CI runs here (tests/README.md, "How long"), the cluster tier took 29 min
# and the rest 25 one after the other (57 min in all), much of both waiting on processes and containers;
# side by side .ci/run took 35. They share nothing: every cluster test has its own kubesim or the
# session's real plane on loopback and a database of its own; the node tier's plane listens on the
# node's host address in a network namespace of its own.
# Each pytest keeps its own temporary folder.
#
# The cluster tier's output goes to a file, printed whole at the end (the two never interleave); the
# exit status fails when either failed. PYTEST_ARGS reaches both (a --junitxml gets a suffix for the second).
set -uo pipefail
args=${PYTEST_ARGS:-}
cd "$(dirname "$0")/.."
BIN=.venv/bin
log=$(mktemp -t agentrun-cluster-tier.XXXXXX)
echo "tests/cluster runs beside the other tiers; its output: $log (printed at the end)"
# A background job of a script gets SIGINT ignored (POSIX, no job control), and every process the tier starts would
# inherit that: `kubectl agentrun ui` then outlived the tests' Ctrl-C (SIGINT) in CI, silently. `trap - INT` in the
# subshell gives the tier the default SIGINT a terminal's command has.
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
(trap - INT; exec $BIN/pytest -q ${args//.xml/-cluster.xml} tests/cluster) >"$log" 2>&1 &
cluster=$!
trap 'kill -INT $cluster 2>/dev/null; wait $cluster' INT TERM
# shellcheck disable=SC2086
$BIN/pytest -q $args --ignore=tests/cluster
rest=$?
wait $cluster
cluster_status=$?
trap - INT TERM
echo
echo "============================ tests/cluster (exit $cluster_status) ============================"
cat "$log"
echo "every tier but tests/cluster: exit $rest; tests/cluster: exit $cluster_status"
[ "$rest" -eq 0 ] && [ "$cluster_status" -eq 0 ]
