#!/usr/bin/env bash
# make test: every tier, as four pytest processes at once.
#
# Why four: one pytest took 57 min and two (the cluster tier beside the rest) 35.5, each tier about as long as alone;
# so the cluster tier is cut in two (the operator's scenarios, faults, scale and chaos; the clients: kubectl, the
# plugin, Helm, the history server, the local cluster) and the rest in two (the real node and kubesim's self-tests,
# with the integration tier; the postgres, bad-input, unit and chart tiers, in the foreground). Measured: 21.5 min
# for 2,209 tests (37 min before the real server's teardowns were cut). Both cores are
# saturated now (tests/README.md, "How long"): less CPU per test is what shortens it further.
# They share nothing: every cluster test has its own kubesim, or its process's session real plane on loopback, and
# a database of its own; the node tier's plane listens on the node's host address in a network namespace of its own.
# Each pytest keeps its own temporary folder.
#
# The background streams' output goes to files, printed whole at the end (nothing interleaves); the exit status
# fails when any stream failed. PYTEST_ARGS reaches every stream (a --junitxml gets the stream's name as a suffix).
set -uo pipefail
args=${PYTEST_ARGS:-}
cd "$(dirname "$0")/.."
BIN=.venv/bin

operator_modules=(tests/cluster/test_operator*.py tests/cluster/test_chaos_smoke.py
    tests/cluster/test_bench_operator_smoke.py tests/cluster/test_pgbouncer_scale.py tests/cluster/test_fuzzed_specs.py)
not_operator=()
for module in "${operator_modules[@]}"; do not_operator+=("--ignore=$module"); done

names=() pids=() logs=()
background() {  # background NAME PYTEST-ARGUMENTS...
    local name=$1 log
    shift
    log=$(mktemp -t "agentrun-$name.XXXXXX")
    echo "$name runs in the background; its output: $log (printed at the end)"
    # A background job of a script gets SIGINT ignored (POSIX, no job control), and every process it starts would
    # inherit that: `kubectl agentrun ui` then outlived the tests' Ctrl-C (SIGINT) in CI, silently. `trap - INT` in
    # the subshell gives the stream the default SIGINT a terminal's command has.
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
    (trap - INT; exec $BIN/pytest -q ${args//.xml/-$name.xml} "$@") >"$log" 2>&1 &
    names+=("$name") pids+=($!) logs+=("$log")
}
background cluster-operator "${operator_modules[@]}"
background cluster-clients tests/cluster "${not_operator[@]}"
background node-kubesim-integration tests/node kubesim/tests tests/integration
trap 'kill -INT "${pids[@]}" 2>/dev/null; wait' INT TERM
# shellcheck disable=SC2086
# (--ignore does not apply to a testpaths entry itself: kubesim/tests needs the glob)
foreground_log=$(mktemp -t agentrun-foreground.XXXXXX)
$BIN/pytest -q $args --ignore=tests/cluster --ignore=tests/node --ignore-glob='kubesim/tests/*' --ignore=tests/integration \
    2>&1 | tee "$foreground_log"
status=${PIPESTATUS[0]}
summary="postgres, badinput, unit, chart: exit $status"
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    code=$?
    echo
    echo "============================ ${names[$i]} (exit $code) ============================"
    cat "${logs[$i]}"
    summary+="; ${names[$i]}: exit $code"
    [ "$code" -eq 0 ] || status=1
done
trap - INT TERM
# An exit of 3 is pytest's internal error, printed where the stream's output is (CI keeps only the tail): again here.
if grep -q "INTERNALERROR" "$foreground_log" "${logs[@]}"; then
    echo
    echo "============================ pytest's internal errors, again ============================"
    grep -H "INTERNALERROR" "$foreground_log" "${logs[@]}" | tail -80
fi
echo "$summary"
exit "$status"
