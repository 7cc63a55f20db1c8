"""``python -m bench.chaos``: the seeded fault campaign (``make chaos``), one trial's replay.

    python -m bench.chaos [run] [--trials 220] [--first-seed 1] [--concurrency 14]
    python -m bench.chaos replay SEED [SEED ...]

``run`` writes ``bench/results/reliability.json`` and ``bench/RELIABILITY.md`` (``--no-write``:
print the figures only); a failed trial keeps its evidence under ``bench/results/chaos/<seed>/``.
``replay`` runs the named trials alone in a fresh world and prints their figures and reasons.
Needs PostgreSQL's server binaries and redis-server on the machine (``bash scripts/services.sh``
checks the toolchain the tests use); starts its own servers on free ports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import campaign, report
from .plan import plan
from .verdict import failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    runner = sub.add_parser("run", help="the campaign (the default)")
    replay = sub.add_parser("replay", help="rerun trials by seed, alone")
    replay.add_argument("seeds", type=int, nargs="+")
    replay.add_argument("--keep", type=Path, help="keep the world's files (pod and operator logs) here")
    for command in (parser, runner):
        command.add_argument("--trials", type=int, default=220)
        command.add_argument("--first-seed", type=int, default=1)
        command.add_argument("--concurrency", type=int, default=14)
        command.add_argument("--no-write", action="store_true", help="print the figures, write no file")
    args = parser.parse_args(argv)

    if args.command == "replay":
        for seed in args.seeds:
            print(json.dumps(plan(seed).to_json()), flush=True)
        result = campaign.run(args.seeds, concurrency=len(args.seeds), workdir=args.keep)
        for outcome in result.outcomes:
            print(json.dumps({"seed": outcome.seed, "verdict": outcome.verdict, "error": outcome.error}, indent=1))
            if outcome.evidence is not None:
                print(json.dumps({"injected": outcome.evidence["injected"]}, indent=1))
        return 1 if any(o.verdict is None or failed(o.verdict) for o in result.outcomes) else 0

    seeds = list(range(args.first_seed, args.first_seed + args.trials))
    result = campaign.run(seeds, concurrency=args.concurrency)
    figures = campaign.summary(result)
    if args.no_write:
        print(json.dumps(figures, indent=1))
    else:
        report.write(figures)
        print(f"wrote {report.JSON.relative_to(report.ROOT)} and {report.MARKDOWN.relative_to(report.ROOT)}")
    losses = [f for f in report.LOSS_FIGURES if figures[f]]
    print(f"{figures['trials']} trials in {figures['campaign']['seconds']}s; losses: {losses or 'none'}")
    return 1 if losses else 0


if __name__ == "__main__":
    sys.exit(main())
