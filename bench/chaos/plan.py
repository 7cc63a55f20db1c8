"""A trial's plan from its seed alone: the scenario and the faults, their kinds, moments and sizes.

Pure: ``plan(seed)`` does no I/O, so a seed names a trial for good (``python -m
bench.chaos replay SEED`` reruns it). The moment of a fault is an anchor the run
reaches for sure (a tool body starting, the runner process running, the resumed
attempt running) plus a seeded delay; what the delay lands on (which line of which
node) then depends on the machine's timing, which no seed controls.

Coverage: the first fault's kind is ``KINDS[(seed - 1) % len(KINDS)]``, so any run of
consecutive seeds spreads evenly over the kinds; about a third of the trials get a
second fault (and a few a third) of a kind drawn at random.

One kind is a scenario rather than a blow from outside: ``MCP_SIBLING_TIMEOUT`` runs the
trial's first round of tools on an MCP server (``bench.chaos.mcp_graph``), one session
for all its calls, with a fourth call, ``fraud_check``, that never answers and reaches
its own deadline while ``charge_card`` is in flight on the same session. Its trials
(and their baselines, ``b-mcp-*``) are that scenario; it is only ever a first fault,
and other kinds may come on top of it.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

# Runner crashes: the operator is right to count them against maxRestarts.
KILL_IN_TOOL = "runner_sigkill_in_tool"
KILL_IN_CHECKPOINT_TXN = "runner_sigkill_in_checkpoint_txn"
KILL_BEFORE_LEDGER_RECORD = "runner_sigkill_between_tool_return_and_ledger_record"
KILL_DURING_RESUME = "runner_sigkill_during_interrupt_resume"
KILL_DURING_DRAIN = "runner_sigkill_during_sigterm_drain"
# Infrastructure: never a restart charged to the run.
EVICTION = "pod_eviction"
NODE_LOSS = "node_loss"
OPERATOR_LEADER_KILL = "operator_leader_sigkill"
POSTGRES_RESTART = "postgres_restart"
REDIS_RESTART = "redis_restart"
FROZEN_RUNNER = "runner_sigstop_then_fenced_after_successor"
# A scenario: an MCP server with two calls in flight on one session when one reaches its deadline.
MCP_SIBLING_TIMEOUT = "mcp_call_past_its_deadline_beside_a_charge"

KINDS = (
    KILL_IN_TOOL,
    KILL_IN_CHECKPOINT_TXN,
    KILL_BEFORE_LEDGER_RECORD,
    KILL_DURING_RESUME,
    KILL_DURING_DRAIN,
    EVICTION,
    NODE_LOSS,
    OPERATOR_LEADER_KILL,
    POSTGRES_RESTART,
    REDIS_RESTART,
    FROZEN_RUNNER,
    MCP_SIBLING_TIMEOUT,
)
RUNNER_CRASHES = frozenset({KILL_IN_TOOL, KILL_IN_CHECKPOINT_TXN, KILL_BEFORE_LEDGER_RECORD, KILL_DURING_RESUME})
RUNNER_CRASHES |= {KILL_DURING_DRAIN}
# Armed in the runner through AGENTRUN_FAULT_POINT (agentrun.faults): one per trial, in one attempt.
FAULT_POINTS = frozenset({KILL_IN_CHECKPOINT_TXN, KILL_BEFORE_LEDGER_RECORD})
# Faults of the whole world (every run in flight feels them), serialized by the campaign.
GLOBAL = frozenset({OPERATOR_LEADER_KILL, POSTGRES_RESTART, REDIS_RESTART})
# Kinds that choose the trial's scenario: a first fault only, never drawn as an extra one.
SCENARIOS = frozenset({MCP_SIBLING_TIMEOUT})
# The MCP scenario's call that never answers, and its deadline (fixed: its error text is in the final
# messages, which every trial of the scenario must share with its baseline). Long enough for the
# runner to start the MCP server and open the session that all four calls of the round wait for.
DEADLINE_TOOL = "fraud_check"
DEADLINE_SECONDS = 4.0

FIRST_ROUND = ("lookup_order", "charge_card", "send_receipt")
ANCHOR_TOOL = "tool"  # a tool body starting in the current attempt
ANCHOR_RUNNING = "running"  # the current attempt's runner process started
ANCHOR_RESUMED = "resumed"  # the attempt that resumes the interrupt started
ANCHOR_POINT = "point"  # the runner kills itself at the fault point
ANCHOR_SCENARIO = "scenario"  # nothing to do from outside: the trial's scenario is the fault


@dataclass(frozen=True)
class Fault:
    kind: str
    anchor: str
    delay: float  # seconds after the anchor
    tool: str | None = None  # the anchor's tool (any tool when None), or the fault point's tool
    version: int | None = None  # in_checkpoint_txn: the state version being written
    down: float = 0.0  # PostgreSQL / Redis: seconds between stop and start
    grace: int | None = None  # eviction: deleteOptions.gracePeriodSeconds (None: the pod's own)
    drain: float = 0.0  # SIGTERM drain: seconds between SIGTERM and SIGKILL


@dataclass(frozen=True)
class Plan:
    seed: int
    approval: bool  # the second round interrupts for a human (the run goes Interrupted, then resumed)
    tool_seconds: float
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    mcp: bool = False  # the first round's tools run on an MCP server (MCP_SIBLING_TIMEOUT)

    @property
    def fault_point(self) -> str | None:
        """``AGENTRUN_FAULT_POINT`` for the runner pods of the trial, armed in attempt 1 only."""
        for fault in self.faults:
            if fault.kind == KILL_IN_CHECKPOINT_TXN:
                return f"in_checkpoint_txn:{fault.version}@1"
            if fault.kind == KILL_BEFORE_LEDGER_RECORD:
                return f"after_tool:{fault.tool}@1"
        return None

    def text(self) -> str:
        """The user's message: the scenario (the same for every seed with the same ``approval``)."""
        ask = "charge my saved card for order 4821 and email me the receipt"
        ask += "; run the fraud check too" if self.mcp else ""
        return ask + ("; a goodwill refund needs approval" if self.approval else "")

    @property
    def graph(self) -> str:
        """The AgentRun's ``spec.graph``."""
        return "bench.chaos.mcp_graph:app" if self.mcp else "bench.chaos.graph:app"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _fault(kind: str, rng: random.Random, *, approval: bool, tool_seconds: float, first: bool) -> Fault:
    anywhere = rng.choice((ANCHOR_TOOL, ANCHOR_RUNNING))
    tool = rng.choice(FIRST_ROUND) if first else None
    if kind == MCP_SIBLING_TIMEOUT:
        return Fault(kind, ANCHOR_SCENARIO, 0.0, tool=DEADLINE_TOOL)
    if kind == KILL_IN_TOOL:
        return Fault(kind, ANCHOR_TOOL, round(rng.uniform(0, tool_seconds), 3), tool=tool)
    if kind == KILL_IN_CHECKPOINT_TXN:
        # attempt 1 writes versions 1..6 (1..5 with an approval: the 5th marks it Interrupted)
        return Fault(kind, ANCHOR_POINT, 0.0, version=rng.randint(2, 5 if approval else 6))
    if kind == KILL_BEFORE_LEDGER_RECORD:
        return Fault(kind, ANCHOR_POINT, 0.0, tool=rng.choice(FIRST_ROUND if approval else (*FIRST_ROUND, "add_note")))
    if kind == KILL_DURING_RESUME:
        return Fault(kind, ANCHOR_RESUMED, round(rng.uniform(0.0, 2.0), 3))
    if kind == KILL_DURING_DRAIN:
        return Fault(
            kind, ANCHOR_TOOL, round(rng.uniform(0, tool_seconds), 3), tool=tool, drain=round(rng.uniform(0, 0.6), 3)
        )
    if kind == EVICTION:
        grace = rng.choice((None, 1, 2))
        return Fault(kind, anywhere, round(rng.uniform(0, 1.5), 3), tool=tool, grace=grace)
    if kind in (POSTGRES_RESTART, REDIS_RESTART):
        return Fault(kind, anywhere, round(rng.uniform(0, 1.5), 3), tool=tool, down=round(rng.uniform(0.5, 4.0), 2))
    return Fault(kind, anywhere, round(rng.uniform(0, 1.5), 3), tool=tool)  # node loss, leader kill, frozen


def plan(seed: int) -> Plan:
    """The trial of ``seed``: deterministic, see the module docstring."""
    rng = random.Random(seed)
    first_kind = KINDS[(seed - 1) % len(KINDS)]
    approval = first_kind == KILL_DURING_RESUME or rng.random() < 0.3
    tool_seconds = round(rng.uniform(0.3, 1.0), 2)
    extra = 0 if rng.random() < 0.65 else (1 if rng.random() < 0.85 else 2)
    kinds = [first_kind]
    for _ in range(extra):
        candidates = [k for k in KINDS if k not in FAULT_POINTS | SCENARIOS and (approval or k != KILL_DURING_RESUME)]
        kinds.append(rng.choice(candidates))
    # The resume fault waits for the interrupt; a fault point fires in attempt 1: both come first.
    kinds.sort(key=lambda k: (k not in FAULT_POINTS, k == KILL_DURING_RESUME))
    faults = tuple(
        _fault(k, rng, approval=approval, tool_seconds=tool_seconds, first=(i == 0)) for i, k in enumerate(kinds)
    )
    return Plan(seed, approval, tool_seconds, faults, mcp=first_kind == MCP_SIBLING_TIMEOUT)
