"""One trial: the run under its faults, judged against an uninterrupted run of its scenario.

The trial is the AgentRun ``t<seed>``. A seed's scenario is its message (with or without
the approval step) and nothing else the run's outcome depends on (tool timing changes
when things happen, not what), so the uninterrupted run of a seed is the uninterrupted
run of its scenario: ``Baselines`` runs one per scenario (``b-plain``, ``b-approval``;
the MCP scenario's ``b-mcp-plain``, ``b-mcp-approval``) in the same world, with the same
graph and message, and every trial of that scenario is compared with it. The driver
waits for each fault's anchor, adds the seeded delay, injects it, and answers the run's
interrupt (``spec.resume``) whenever it is Interrupted, as a human would. The
duplicate-pod watch (``PodWatch``) and the status cache (``Statuses``) run for the whole
campaign.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import plan as p
from .evidence import Evidence, ThreadRows, newest_written_attempt, read_effects, thread_rows
from .inject import Globals, Zombie, call, node_unreachable, partition, pods_alive
from .world import NAMESPACE, STORE_SECRET, World

T = TypeVar("T")
AGENTRUNS = f"/apis/agentrun.dev/v1alpha1/namespaces/{NAMESPACE}/agentruns"
TERMINAL = ("Succeeded", "Failed", "Stopped")
POLL = 0.3
RUN_TIMEOUT = 240.0  # a trial that has not ended by then is not finished
STUCK = 15.0
# Set when the campaign is interrupted (Ctrl-C): every wait ends at once, so the world can be torn down.
ABORT = threading.Event()


def _attempt_of(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


def _run_of(pod: str) -> str:
    return pod.rsplit("-", 1)[0]


class PodWatch(threading.Thread):
    """Samples the live runner processes every 0.1 s; two of one run alive at once is a duplicate."""

    def __init__(self, world: World) -> None:
        super().__init__(name="chaos-pod-watch", daemon=True)
        self.world = world
        self.overlaps: dict[str, set[tuple[str, str]]] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.1):
            if self.world.kubelet is None:
                return
            by_run: dict[str, list[str]] = {}
            for pod in pods_alive(self.world.kubelet):
                by_run.setdefault(_run_of(pod), []).append(pod)
            for run, pods in by_run.items():
                if len(pods) > 1:
                    pods.sort(key=_attempt_of)
                    for older, newer in itertools.pairwise(pods):
                        self.overlaps.setdefault(run, set()).add((older, newer))

    def stop(self) -> None:
        self._stop.set()

    def of(self, run: str) -> list[list[str]]:
        return [list(pair) for pair in sorted(self.overlaps.get(run, set()))]


class Statuses(threading.Thread):
    """Every AgentRun's status, listed every 0.3 s: one API read for all trials instead of one per trial."""

    def __init__(self, world: World) -> None:
        super().__init__(name="chaos-statuses", daemon=True)
        self.world = world
        self.latest: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.3):
            with contextlib.suppress(Exception):  # the emulator is busy or stopping: next time
                runs = self.world.cluster.list_objects("agentruns", NAMESPACE)
                self.latest = {r["metadata"]["name"]: dict(r.get("status") or {}) for r in runs}

    def stop(self) -> None:
        self._stop.set()

    def of(self, name: str) -> dict[str, Any]:
        return self.latest.get(name, {})


class Baselines:
    """The uninterrupted run of each scenario, created on first use and driven to its end on a thread."""

    def __init__(self, world: World, statuses: Statuses, workdir: Path) -> None:
        self.world, self.statuses, self.workdir = world, statuses, workdir
        self._lock = threading.Lock()
        self._done: dict[str, threading.Event] = {}
        self._result: dict[str, tuple[dict[str, Any], ThreadRows]] = {}

    @staticmethod
    def name(trial: p.Plan) -> str:
        """The baseline of the trial's scenario: its approval step, and whether its tools are on MCP."""
        return ("b-mcp-" if trial.mcp else "b-") + ("approval" if trial.approval else "plain")

    def ensure(self, trial: p.Plan) -> None:
        name = self.name(trial)
        with self._lock:
            if name in self._done:
                return
            self._done[name] = threading.Event()
        effects = self.workdir / f"{name}.effects"
        response = call(self.world.cluster, "POST", AGENTRUNS, manifest(name, trial, effects, faults=False))
        if response.status not in (201, 409):
            raise RuntimeError(f"could not create {name}: {response}")
        threading.Thread(target=self._drive, args=(name,), name=f"chaos-{name}", daemon=True).start()

    def _drive(self, name: str) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT
        resumed = False
        state: dict[str, Any] = {}
        while time.monotonic() < deadline and not ABORT.is_set():
            state = self.statuses.of(name)
            if state.get("phase") in TERMINAL:
                break
            if state.get("phase") == "Interrupted" and not resumed:
                resumed = answer(self.world, name)
            time.sleep(POLL)
        final = dict((self.world.cluster.get("agentruns", name, NAMESPACE) or {}).get("status") or {})
        self._result[name] = (final, thread_rows(self.world.postgres.dsn, f"{NAMESPACE}/{name}"))
        self._done[name].set()

    def result(self, trial: p.Plan) -> tuple[dict[str, Any], ThreadRows]:
        """The baseline's final status and rows (waits for its end)."""
        name = self.name(trial)
        self._done[name].wait(RUN_TIMEOUT + 60)
        return self._result.get(name, ({}, ThreadRows(thread_id="", states=[], messages=[], ledger=[], intents=[])))


def answer(world: World, name: str) -> bool:
    """``spec.resume`` as a human would give it (the same answer in every trial and baseline)."""
    body = {"spec": {"resume": {"value": {"approved": True, "by": "chaos"}}}}
    response = call(world.cluster, "PATCH", f"{AGENTRUNS}/{name}", body, content_type="application/merge-patch+json")
    return response.status == 200


def manifest(name: str, trial: p.Plan, effects: Path, *, faults: bool) -> dict[str, Any]:
    env = [
        {"name": "CHAOS_EFFECTS", "value": str(effects)},
        {"name": "CHAOS_TOOL_SECONDS", "value": str(trial.tool_seconds)},
    ]
    if faults and trial.fault_point:
        env.append({"name": "AGENTRUN_FAULT_POINT", "value": trial.fault_point})
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "labels": {"bench.agentrun.dev/seed": str(trial.seed)}},
        "spec": {
            "graph": trial.graph,
            "threadId": name,
            "input": {"messages": [{"role": "user", "content": trial.text()}]},
            "store": {"secretRef": {"name": STORE_SECRET}},
            "podTemplate": {"env": env},
            # Room for the campaign's runner crashes (up to three per trial) with a short backoff.
            "restartPolicy": {"maxRestarts": 10, "backoffSeconds": 1},
        },
    }


class Trial:
    def __init__(
        self,
        world: World,
        faults: Globals,
        watch: PodWatch,
        statuses: Statuses,
        baselines: Baselines,
        trial: p.Plan,
        workdir: Path,
    ) -> None:
        self.world, self.globals, self.watch, self.statuses, self.plan = world, faults, watch, statuses, trial
        self.baselines = baselines
        self.name, self.baseline = f"t{trial.seed}", Baselines.name(trial)
        self.workdir = workdir
        self.effects = workdir / f"{self.name}.effects"
        self.baseline_effects = workdir / f"{self.baseline}.effects"
        self.resumed: dict[str, int] = {}  # run -> the attempt that resumes its interrupt
        self.injected: list[dict[str, Any]] = []
        self.zombies: list[dict[str, Any]] = []
        self.frozen: list[Zombie] = []  # killed at the end whatever happened
        self.errors: list[str] = []
        self.started = time.monotonic()

    # --- the API ---------------------------------------------------------------------------------

    @property
    def kubelet(self) -> Any:
        assert self.world.kubelet is not None
        return self.world.kubelet

    def status(self, name: str) -> dict[str, Any]:
        return self.statuses.of(name)

    def final_status(self, name: str) -> dict[str, Any]:
        run = self.world.cluster.get("agentruns", name, NAMESPACE)
        return dict((run or {}).get("status") or {})

    def finished(self, name: str) -> bool:
        return self.status(name).get("phase") in TERMINAL

    def tick(self) -> None:
        """Answer the trial's interrupt as a human would: once (the graph interrupts once)."""
        if self.name in self.resumed:
            return
        state = self.status(self.name)
        if state.get("phase") == "Interrupted" and answer(self.world, self.name):
            self.resumed[self.name] = int(state.get("attempt") or 0) + 1

    def wait(self, what: Callable[[], T | None], timeout: float) -> T | None:
        """``what()`` once truthy, ticking meanwhile; None on timeout or once the trial ended."""
        deadline = min(time.monotonic() + timeout, self.started + RUN_TIMEOUT)
        while time.monotonic() < deadline and not ABORT.is_set():
            self.tick()
            found = what()
            if found:
                return found
            if self.finished(self.name):
                return None
            time.sleep(POLL)
        return None

    def live_pod(self, min_attempt: int) -> str | None:
        pods = [q for q in pods_alive(self.kubelet) if _run_of(q) == self.name and _attempt_of(q) >= min_attempt]
        return max(pods, key=_attempt_of) if pods else None

    # --- anchors ---------------------------------------------------------------------------------

    def anchor(self, fault: p.Fault, min_attempt: int, offset: int) -> str | None:
        """The pod to hit once the fault's moment has come; None when the run gave no such moment."""
        if fault.anchor == p.ANCHOR_TOOL:

            def tool_started() -> str | None:
                for line in read_effects(self.effects)[offset:]:
                    if line.get("kind") != "begin" or line["attempt"] < min_attempt:
                        continue
                    if fault.tool is None or line["tool"] == fault.tool:
                        pod = f"{self.name}-{line['attempt']}"
                        if pod in pods_alive(self.kubelet):
                            return pod
                return None

            # No such tool body ran (replayed from the ledger, or already past it): any moment of a runner.
            if self.wait(tool_started, 30) is None and self.wait(lambda: self.live_pod(min_attempt), 5) is None:
                return None
        elif fault.anchor == p.ANCHOR_RESUMED:

            def resumed() -> str | None:
                attempt = self.resumed.get(self.name)
                return self.live_pod(attempt) if attempt is not None else None

            if self.wait(resumed, 90) is None:
                return None
        elif self.wait(lambda: self.live_pod(min_attempt), 30) is None:
            return None
        time.sleep(fault.delay)
        return self.live_pod(min_attempt)

    # --- faults ----------------------------------------------------------------------------------

    def inject(self, fault: p.Fault, pod: str) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": fault.kind,
            "pod": pod,
            "attempt": _attempt_of(pod),
            "at": round(time.monotonic() - self.started, 3),
            "hit": False,
            "note": "",
        }
        kubelet = self.kubelet
        try:
            if fault.kind in (p.KILL_IN_TOOL, p.KILL_DURING_RESUME):
                kubelet.kill(pod, signal.SIGKILL, NAMESPACE)
                record.update(hit=True, note="SIGKILL")
            elif fault.kind == p.KILL_DURING_DRAIN:
                kubelet.kill(pod, signal.SIGTERM, NAMESPACE)
                time.sleep(fault.drain)
                if pod in pods_alive(kubelet):
                    kubelet.kill(pod, signal.SIGKILL, NAMESPACE)
                    record.update(hit=True, note=f"SIGTERM, SIGKILL {fault.drain:.2f}s into the drain")
                else:
                    code = kubelet.kubelet.runtime(pod, NAMESPACE).exit_code
                    record["note"] = f"SIGTERM; the runner ended (exit {code}) within {fault.drain:.2f}s, no SIGKILL"
                    if code == 128 + signal.SIGTERM:
                        # The SIGTERM came as the runner was exiting, after its handler was gone (its last
                        # line was written): it died of the signal. Sent without a pod deletion, the operator
                        # cannot tell it from a crash, so it is the campaign's crash, charged like one.
                        record["crashed"] = True
                        record["note"] += ": killed by the SIGTERM itself, in its last moments"
            elif fault.kind == p.EVICTION:
                kubelet.evict(pod, NAMESPACE, grace_period=fault.grace)
                record.update(hit=True, note=f"Eviction API, grace {fault.grace if fault.grace is not None else 'pod'}")
            elif fault.kind == p.NODE_LOSS:
                kubelet.lose_node(pod, NAMESPACE)
                record.update(hit=True, note="node lost: runner SIGKILLed, pod phase Unknown")
            elif fault.kind == p.FROZEN_RUNNER:
                zombie = partition(kubelet, pod)
                if zombie is not None:
                    self.frozen.append(zombie)
                    node_unreachable(self.world.cluster, kubelet, pod)
                    record.update(hit=True, note=self.thaw_after_successor(zombie))
            elif fault.kind == p.POSTGRES_RESTART:
                record.update(hit=True, note=self.globals.restart_postgres(fault.down))
            elif fault.kind == p.REDIS_RESTART:
                record.update(hit=True, note=self.globals.restart_redis(fault.down))
            elif fault.kind == p.OPERATOR_LEADER_KILL:
                note = self.globals.kill_leader()
                record.update(hit=note is not None, note=note or "no leader at that moment")
        except (RuntimeError, KeyError, TimeoutError) as e:  # the pod ended between the anchor and the blow
            record["note"] = f"missed: {e}"
        return record

    def thaw_after_successor(self, zombie: Zombie) -> str:
        """Wait until a newer attempt wrote a checkpoint (or the run ended), then SIGCONT the frozen runner."""
        attempt = _attempt_of(zombie.pod)
        thread = f"{NAMESPACE}/{self.name}"

        def successor_acted() -> str | None:
            if newest_written_attempt(self.world.postgres.dsn, thread) > attempt:
                return "after its successor wrote a checkpoint"
            state = self.status(self.name)
            if int(state.get("attempt") or 0) > attempt and state.get("phase") == "Interrupted":
                return "after its successor ended Interrupted"  # it had nothing to write
            return None

        took_over = self.wait(successor_acted, 60)
        thawed = time.time()
        zombie.thaw()
        code = zombie.exit_code(30)
        if code is None:
            zombie.kill()
        self.zombies.append({"pod": zombie.pod, "attempt": attempt, "thawed_at": thawed, "exit_code": code})
        successor = took_over or "after the run ended (or 60 s)"
        return f"SIGSTOP + node unreachable; SIGCONT {successor}; the thawed runner exited {code}"

    # --- the trial -------------------------------------------------------------------------------

    def create(self) -> None:
        self.baselines.ensure(self.plan)
        response = call(
            self.world.cluster, "POST", AGENTRUNS, manifest(self.name, self.plan, self.effects, faults=True)
        )
        if response.status not in (201, 409):  # 409: a retried create that had landed
            raise RuntimeError(f"could not create {self.name}: {response}")

    def run(self) -> Evidence:
        try:
            return self._run()
        finally:
            for zombie in self.frozen:
                zombie.kill()

    def _run(self) -> Evidence:
        self.create()
        min_attempt, offset = 1, 0
        for fault in self.plan.faults:
            if fault.anchor in (p.ANCHOR_POINT, p.ANCHOR_SCENARIO):
                continue  # the runner kills itself at the point, the scenario is the fault: both seen afterwards
            pod = self.anchor(fault, min_attempt, offset)
            if pod is None:
                self.injected.append({"kind": fault.kind, "hit": False, "note": "missed: the run gave no moment"})
                continue
            record = self.inject(fault, pod)
            self.injected.append(record)
            if record["hit"] and fault.kind not in p.GLOBAL:
                min_attempt = record["attempt"] + 1
            offset = len(read_effects(self.effects))
        self.wait_end(self.name)
        fired = self.fault_point_fired()
        if self.plan.fault_point:
            kind = next(f.kind for f in self.plan.faults if f.anchor == p.ANCHOR_POINT)
            note = f"AGENTRUN_FAULT_POINT={self.plan.fault_point}" + ("" if fired else " (never reached)")
            self.injected.insert(0, {"kind": kind, "pod": f"{self.name}-1", "attempt": 1, "hit": fired, "note": note})
        for fault in self.plan.faults:
            if fault.anchor == p.ANCHOR_SCENARIO:
                self.injected.insert(0, self.scenario_happened(fault))
        return self.evidence(fired)

    def scenario_happened(self, fault: p.Fault) -> dict[str, Any]:
        """The MCP scenario's record: hit when, in one server, a charge answered after the deadline's cancel."""
        effects = read_effects(self.effects)
        cancels = [e for e in effects if e.get("kind") == "cancelled" and e["tool"] == fault.tool]
        answers = [e for e in effects if e.get("kind") == "answered" and e["tool"] == "charge_card"]
        both = [(c, a) for c in cancels for a in answers if a["pid"] == c["pid"] and a["begin"] >= c["begin"]]
        record: dict[str, Any] = {"kind": fault.kind, "hit": bool(both), "at": None}
        if both:
            cancel, answer = both[0]
            record.update(
                pod=f"{self.name}-{cancel['attempt']}",
                attempt=cancel["attempt"],
                note=f"{fault.tool} cancelled at its {p.DEADLINE_SECONDS:g}s deadline with charge_card in flight "
                f"on the same MCP session; charge_card answered {answer['begin'] - cancel['begin']:.2f}s later",
            )
        else:
            record.update(
                pod=None,
                attempt=None,
                note=f"missed: no charge_card answered after a cancelled {fault.tool} "
                f"({len(cancels)} cancellation(s), {len(answers)} answer(s))",
            )
        return record

    def wait_end(self, name: str) -> dict[str, Any] | None:
        """The run's final status; None once RUN_TIMEOUT passed, or once it sat Interrupted again for
        STUCK seconds after its answer started a newer attempt (the answer was not applied twice: a
        human would have to answer again; counted as not finished)."""
        deadline = self.started + RUN_TIMEOUT
        stuck_since: float | None = None
        while time.monotonic() < deadline and not ABORT.is_set():
            self.tick()
            state = self.status(name)
            if state.get("phase") in TERMINAL:
                return state
            again = name in self.resumed and state.get("phase") == "Interrupted"
            if again and int(state.get("attempt") or 0) >= self.resumed[name]:
                stuck_since = stuck_since or time.monotonic()
                if time.monotonic() - stuck_since > STUCK:
                    self.errors.append(f"{name} is Interrupted again after its answer (attempt {state.get('attempt')})")
                    return None
            else:
                stuck_since = None
            time.sleep(POLL * 2)
        self.errors.append(f"{name} did not end within {RUN_TIMEOUT:.0f}s")
        return None

    def fault_point_fired(self) -> bool:
        with contextlib.suppress(KeyError, OSError):
            return "AGENTRUN-FAULT " in self.kubelet.logs(f"{self.name}-1", NAMESPACE)
        return False

    def evidence(self, fired: bool) -> Evidence:
        dsn = self.world.postgres.dsn
        baseline_status, baseline = self.baselines.result(self.plan)
        return Evidence(
            seed=self.plan.seed,
            plan=self.plan.to_json(),
            injected=self.injected,
            trial=thread_rows(dsn, f"{NAMESPACE}/{self.name}"),
            baseline=baseline,
            trial_status=self.final_status(self.name),
            baseline_status=baseline_status,
            effects=read_effects(self.effects),
            overlaps=self.watch.of(self.name),
            zombies=self.zombies,
            fault_point_fired=fired,
            seconds=round(time.monotonic() - self.started, 2),
            errors=self.errors,
        )
