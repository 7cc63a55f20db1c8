"""The local demo: run the support agent on SQLite, SIGKILL it mid-tool, resume, count charges.

    make demo        (or: python examples/crash_resume_demo.py)

Every step is the real ``agentrun`` CLI in a child process; the kill is a
real SIGKILL, delivered right after ``charge_card`` returned and its result
was recorded in the ledger, before the tool node finished.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.support_agent import count_effects  # noqa: E402

WORK = ROOT / ".demo"
GRAPH = "examples.support_agent:app"
THREAD = "order-4821"
REQUEST = "charge my saved card for order 4821 and email me the receipt"


def banner(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def agentrun(*args: str, fault: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env.update(
        AGENTRUN_STORE=f"sqlite:///{WORK / 'agentrun.db'}",
        SUPPORT_EFFECTS_DB=str(WORK / "effects.db"),
        SUPPORT_TOOL_DELAY="0.3",
        PYTHONPATH=str(ROOT),
    )
    if fault:
        env["AGENTRUN_FAULT_POINT"] = fault
    cmd = [sys.executable, "-m", "agentrun.cli", *args]
    print(
        "$ agentrun "
        + " ".join(a if " " not in a else repr(a) for a in args)
        + (f"    (with AGENTRUN_FAULT_POINT={fault})" if fault else ""),
        flush=True,
    )
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()

    banner("1. The customer asks; the process is SIGKILLed right after the card was charged")
    code = agentrun("run", GRAPH, "--thread-id", THREAD, "--input", REQUEST, fault="after_ledger_record:charge_card")
    print(f"-> exit status {code} ({'killed by SIGKILL' if code == -signal.SIGKILL else 'unexpected'})")
    print(f"-> payment provider so far: {count_effects(str(WORK / 'effects.db'))}")

    banner("2. The thread as the store saw it at the crash")
    agentrun("state", "--thread-id", THREAD)

    banner("3. Run the same thread again: it resumes; completed calls come from the ledger")
    code = agentrun("run", GRAPH, "--thread-id", THREAD)

    effects = count_effects(str(WORK / "effects.db"))
    banner("4. What the customer experienced")
    print(
        f"charges: {effects['charges']}   receipts: {effects['receipts']}   "
        f"tool invocations (all tools): {effects['tool_invocations']}"
    )
    ok = code == 0 and effects["charges"] == 1 and effects["receipts"] == 1
    print("\033[32mcharged exactly once.\033[0m" if ok else "\033[31mDEMO FAILED\033[0m")
    print(
        f"(files in {WORK.relative_to(ROOT)}/; inspect with: "
        f"AGENTRUN_STORE=sqlite:///{(WORK / 'agentrun.db').relative_to(ROOT)} "
        f".venv/bin/agentrun state --thread-id {THREAD})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
