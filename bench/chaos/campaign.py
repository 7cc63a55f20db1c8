"""A campaign: many trials in flight at once in one world, their verdicts, the saved failures.

Trials share the world (one emulated cluster, one kubelet, two operators, one
PostgreSQL and one Redis), ``concurrency`` of them in flight at a time, each with its
baseline, so the machine runs several dozen runner processes at once instead of one
world per trial. A world-wide fault of one trial (PostgreSQL, Redis, the operator
leader) is felt by every run in flight: more faults than a seed names, never fewer.

A trial whose figures show a loss keeps its evidence under ``bench/results/chaos/<seed>/``
(``evidence.json``, ``verdict.json``, the pod logs, the operators' log tails) with the
command that replays it alone.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import plan as p
from .evidence import Evidence
from .inject import Globals
from .trial import ABORT, Baselines, PodWatch, Statuses, Trial
from .verdict import Verdict, failed, judge
from .world import ROOT, World

FAILURES = ROOT / "bench" / "results" / "chaos"
LOG_TAIL = 200_000


@dataclass
class Outcome:
    seed: int
    evidence: Evidence | None
    verdict: Verdict | None
    error: str | None = None
    kept: str | None = None


@dataclass
class Result:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    concurrency: int = 0
    setup_seconds: float = 0.0
    operators_replaced: list[str] = field(default_factory=list)

    def verdicts(self) -> list[Verdict]:
        return [o.verdict for o in self.outcomes if o.verdict is not None]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def keep_failure(world: World, outcome: Outcome, trial: Trial | None, into: Path) -> str:
    """Save what a failed trial left: evidence, verdict, its pods' logs, the operators' log tails."""
    folder = into / str(outcome.seed)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if outcome.evidence is not None:
        (folder / "evidence.json").write_text(json.dumps(outcome.evidence, indent=1, default=str))
    (folder / "verdict.json").write_text(
        json.dumps({"verdict": outcome.verdict, "error": outcome.error}, indent=1, default=str)
    )
    if trial is not None:
        pods = world.workdir / "kubelet" / "logs"
        for log in sorted(pods.glob(f"default_{trial.name}-*")) + sorted(pods.glob(f"default_{trial.baseline}-*")):
            shutil.copy(log, folder / log.name)
        for effects in (trial.effects, trial.baseline_effects):
            if effects.exists():
                shutil.copy(effects, folder / effects.name)
    if trial is not None:  # the operators' lines about this run only (a campaign's logs are long)
        mentions = re.compile(rf"(?<![\w-]){re.escape(trial.name)}(?!\w)")
        for operator in world.operators:
            if operator.log_path.exists():
                lines = operator.log_path.read_text(errors="replace").splitlines(keepends=True)
                kept = "".join(line for line in lines if mentions.search(line))[-LOG_TAIL:]
                (folder / operator.log_path.name).write_text(kept)
    (folder / "REPLAY").write_text(f"python -m bench.chaos replay {outcome.seed}\n")
    return str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)


def run(
    seeds: list[int], *, concurrency: int, failures: Path = FAILURES, workdir: Path | None = None, quiet: bool = False
) -> Result:
    """Run the trials of ``seeds`` (``concurrency`` in flight) in one fresh world; never raises for a trial."""
    scratch = workdir or Path(tempfile.mkdtemp(prefix="agentrun-chaos-"))
    began = time.monotonic()
    world = World(scratch / "world")
    result = Result(concurrency=concurrency)
    ABORT.clear()
    try:
        world.start()
        result.setup_seconds = round(time.monotonic() - began, 1)
        watch = PodWatch(world)
        watch.start()
        statuses = Statuses(world)
        statuses.start()
        (scratch / "trials").mkdir(parents=True, exist_ok=True)
        baselines = Baselines(world, statuses, scratch / "trials")
        faults = Globals(world)

        def one(seed: int) -> tuple[Outcome, Trial | None]:
            trial = None
            try:
                trial = Trial(world, faults, watch, statuses, baselines, p.plan(seed), scratch / "trials")
                trial.workdir.mkdir(parents=True, exist_ok=True)
                evidence = trial.run()
                return Outcome(seed, evidence, judge(evidence)), trial
            except Exception as e:
                return Outcome(seed, None, None, error=f"{type(e).__name__}: {e}"), trial

        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="trial")
        try:
            futures = [pool.submit(one, seed) for seed in seeds]
            for done, future in enumerate(as_completed(futures), 1):
                outcome, trial = future.result()
                bad = outcome.verdict is None or failed(outcome.verdict)
                unrecorded = outcome.verdict is not None and outcome.verdict["figures"]["unrecorded_tool_calls"]
                if bad or unrecorded:
                    outcome.kept = keep_failure(world, outcome, trial, failures)
                result.outcomes.append(outcome)
                if not quiet:
                    injected = outcome.evidence["injected"] if outcome.evidence is not None else []
                    kinds = ",".join(f["kind"] for f in injected if f["hit"])
                    state = "FAILED" if bad else "ok"
                    figures = {k: v for k, v in outcome.verdict["figures"].items() if v} if outcome.verdict else {}
                    _say(
                        f"[{done}/{len(seeds)} {time.monotonic() - began:6.1f}s] seed {outcome.seed} {state} "
                        f"{kinds or '-'} {figures or ''}{' ' + outcome.error if outcome.error else ''}"
                    )
        except BaseException:
            ABORT.set()  # interrupted: trials in flight stop waiting, the rest never start
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        watch.stop()
        statuses.stop()
        result.operators_replaced = list(world.replaced)
    finally:
        world.close()
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    result.outcomes.sort(key=lambda o: o.seed)
    result.seconds = round(time.monotonic() - began, 1)
    return result


def faults_injected(result: Result) -> tuple[dict[str, int], dict[str, int]]:
    """(injected, missed) by kind, every kind listed."""
    hit: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    for outcome in result.outcomes:
        for fault in outcome.evidence["injected"] if outcome.evidence is not None else []:
            (hit if fault["hit"] else missed)[fault["kind"]] += 1
    return {k: hit[k] for k in p.KINDS}, {k: missed[k] for k in p.KINDS}


def summary(result: Result) -> dict[str, Any]:
    """The machine-readable figures (bench/results/reliability.json)."""
    from .verdict import FIGURES, totals

    injected, missed = faults_injected(result)
    figures = totals(result.verdicts())
    harness_errors = [{"seed": o.seed, "error": o.error} for o in result.outcomes if o.error]
    # A trial the harness could not judge counts as not finished: nothing is hidden by an error.
    figures["runs_not_finished"] += len(harness_errors)
    window_by_kind: Counter[str] = Counter()
    details = []
    for outcome in result.outcomes:
        if outcome.verdict is None or outcome.evidence is None:
            continue
        kinds = [f["kind"] for f in outcome.evidence["injected"] if f["hit"]]
        if outcome.verdict["figures"]["window_reexecutions"]:
            for kind in set(kinds):
                window_by_kind[kind] += outcome.verdict["figures"]["window_reexecutions"]
        nonzero = {k: v for k, v in outcome.verdict["figures"].items() if v}
        if nonzero:
            details.append(
                {
                    "seed": outcome.seed,
                    "faults": [
                        {k: f.get(k) for k in ("kind", "attempt", "at", "hit", "note")}
                        for f in outcome.evidence["injected"]
                    ],
                    "figures": nonzero,
                    "why": outcome.verdict["why"],
                    "kept": outcome.kept,
                }
            )
    thawed: Counter[str] = Counter()
    for outcome in result.outcomes:
        for zombie in outcome.evidence["zombies"] if outcome.evidence is not None else []:
            thawed[str(zombie["exit_code"])] += 1
    seeds = [o.seed for o in result.outcomes]
    return {
        "trials": len(result.outcomes),
        "faults_injected": injected,
        **{f: figures[f] for f in FIGURES},
        "faults_missed": missed,
        "window_reexecutions_by_fault_in_trial": dict(sorted(window_by_kind.items())),
        # Exit codes of the frozen runners once thawed: 7 (FENCED) when their next write was refused.
        "frozen_runner_exit_codes": dict(sorted(thawed.items())),
        "failed_trials": [o.seed for o in result.outcomes if o.kept],
        "harness_errors": harness_errors,
        "campaign": {
            "seeds": [min(seeds), max(seeds)] if seeds else [],
            "concurrency": result.concurrency,
            "seconds": result.seconds,
            "setup_seconds": result.setup_seconds,
            "operator_replicas_replaced": result.operators_replaced,
            "replay": "python -m bench.chaos replay <seed>",
        },
        "trials_with_nonzero_figures": details,
    }
