"""The fault campaign's smoke (``make chaos`` in small): 12 seeded trials in one emulated cluster.

Seeds 1 to 12 spread their first faults over every kind, once each (``bench.chaos.plan``; ``make chaos``
runs the hundreds; 24 here cost CI a minute more for each kind a second time):
runner SIGKILLs inside a tool, inside the checkpoint transaction, between a tool's return and
its ledger record, during an interrupt resume and during a SIGTERM drain; eviction; node loss;
SIGKILL of the operator leader (two replicas); a PostgreSQL and a Redis restart (private
servers); a runner frozen with SIGSTOP and thawed after its successor took over; an MCP server
with two calls in flight on one session when one reaches its deadline. Each trial is
compared with an uninterrupted run of its scenario. Guarantees: no recorded tool re-executed, no
step lost, no stale write accepted, every run finished, no duplicate pod, no restart charged for
infrastructure, final states equal to the baselines', no tool error but the planned deadline. A
failing trial keeps its evidence in the test's temporary folder (the failure names it);
``python -m bench.chaos replay <seed>`` reruns it alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos import campaign
from bench.chaos.plan import KILL_DURING_RESUME, KINDS, plan
from bench.chaos.verdict import LOSSES

pytestmark = pytest.mark.timeout(300)

SEEDS = list(range(1, 13))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[campaign.Result]:
    workdir = tmp_path_factory.mktemp("chaos")
    # A failed trial's evidence goes to the test's temporary folder (named in the failure), not the checkout.
    yield campaign.run(SEEDS, concurrency=11, workdir=workdir, failures=workdir / "kept", quiet=True)


def _losses(outcome: campaign.Outcome) -> dict[str, int]:
    assert outcome.verdict is not None, f"seed {outcome.seed}: the harness failed: {outcome.error}"
    return {f: outcome.verdict["figures"][f] for f in LOSSES if outcome.verdict["figures"][f]}


def test_the_smoke_seeds_cover_every_fault_kind() -> None:
    assert {plan(s).faults[0].kind for s in SEEDS} >= set(KINDS)
    assert sum(any(f.kind == KILL_DURING_RESUME for f in plan(s).faults) for s in SEEDS) >= 1


def test_no_fault_loses_a_recorded_tool_call_a_step_a_run_or_the_final_state(smoke: campaign.Result) -> None:
    figures = campaign.summary(smoke)
    print({k: v for k, v in figures.items() if isinstance(v, int)}, figures["faults_injected"])
    broken = {o.seed: _losses(o) for o in smoke.outcomes if _losses(o)}
    why = {o.seed: o.verdict["why"] for o in smoke.outcomes if o.seed in broken and o.verdict}
    kept = {o.seed: o.kept for o in smoke.outcomes if o.seed in broken}
    assert not broken, f"GUARANTEE BROKEN under faults: {broken}\n{why}\nevidence: {kept}"
    landed = sum(figures["faults_injected"].values())
    assert landed >= len(SEEDS), f"only {landed} faults landed in {len(SEEDS)} trials: {figures['faults_missed']}"


def test_a_seed_is_a_plan() -> None:
    assert plan(7) == plan(7) and plan(7) != plan(8)
    assert Path(campaign.FAILURES).name == "chaos"
