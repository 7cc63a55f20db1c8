"""The operator process: ``python -m agentrun_operator`` (configuration: ``AGENTRUN_OPERATOR_*``).

Serves ``/healthz`` (liveness: 503 once the event loop's heartbeat stalls past
``livenessTimeoutSeconds``, see ``io/health.py``), ``/readyz`` and ``/metrics``
on the metrics port from the start, from a thread of their own, waits for the leader Lease, then runs kopf until it is
stopped (SIGTERM: graceful, lease released) or loses the lease (exit 1, so
Kubernetes restarts it as a standby and it never acts without the lease).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

import kopf
from kopf._core.engines.peering import Identity

from agentrun.logs import configure_logging

from .io import memory, metrics
from .io.assemble import Operator, assemble
from .io.health import HealthServer, Heartbeat, freeze_on_signal
from .io.kube import KubeClient
from .io.leader import LeaderElector
from .settings import OperatorSettings

log = logging.getLogger("agentrun_operator")

# An API server accepts JSON nested up to 10,000 levels (Go's encoding/json limit). kopf decodes every watch
# event with json.loads and copies bodies with copy.deepcopy, both recursive: at Python's default limit
# (1,000) one such AgentRun raises RecursionError inside kopf's watch, and the re-listed object breaks it
# again, for every run. Decoding needs one frame per level, deepcopy two (dict -> deepcopy -> dict), plus
# kopf's own stack: 10,000 levels fit in 25,000 frames, well within the 8 MiB main-thread C stack (json's
# C decoder is the only C-recursive step and was measured at 20,000 levels). The spec itself is then refused
# before anything else walks it (decide/hostile.py).
RECURSION_LIMIT = 25_000


def _logging(fmt: str) -> None:
    configure_logging(fmt)
    logging.getLogger("kopf").setLevel(logging.WARNING)


async def run(settings: OperatorSettings) -> int:
    """Run the operator until it is stopped (0) or loses its Lease or kopf fails (1): health server, Lease, kopf."""
    state = {"role": "starting"}
    stop = asyncio.Event()
    # Signal handlers first: once /healthz answers, a signal must find them (the debug hook's SIGUSR2 killed an
    # operator that answered 200 before it had installed its handler).
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if settings.debug_freeze_signal:
        freeze_on_signal(loop, settings.debug_freeze_signal, settings.debug_freeze_seconds)
    if settings.debug_memory_signal:
        memory.dump_on_signal(loop, settings.debug_memory_signal, Path(settings.debug_memory_path))
    heartbeat = Heartbeat(timeout=settings.liveness_timeout_seconds)
    beating = asyncio.create_task(heartbeat.beat())
    http = (
        HealthServer(settings.metrics_port, heartbeat, lambda: state["role"]).start() if settings.metrics_port else None
    )
    kube = KubeClient.from_environment()
    parts = assemble(kube, settings)
    elector = (
        LeaderElector(
            kube, settings.lease_namespace, settings.lease_name, settings.identity, settings.lease_duration_seconds
        )
        if settings.leader_election
        else None
    )
    try:
        if elector is not None:
            state["role"] = "standby"
            if not await _acquired(elector, stop):
                return 0
        state["role"] = "leader"
        metrics.LEADER.set(1)
        log.info(
            "leading as %s; watching %s",
            settings.identity,
            ", ".join(settings.namespaces) if settings.namespaces else "all namespaces",
        )
        code = await _lead(settings=settings, parts=parts, elector=elector, stop=stop)
        if code == 0 and elector is not None:
            await elector.release()
        return code
    finally:
        metrics.LEADER.set(0)
        await parts.stores.close()
        await kube.close()
        beating.cancel()
        if http is not None:
            http.stop()


async def _acquired(elector: LeaderElector, stop: asyncio.Event) -> bool:
    """Wait for the Lease; ``False`` when the operator is stopped first (a standby told to go)."""
    acquiring = asyncio.create_task(elector.acquire())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        acquiring.cancel()
        return False
    stopping.cancel()
    return True


async def _lead(
    *,
    settings: OperatorSettings,
    parts: Operator,
    elector: LeaderElector | None,
    stop: asyncio.Event,
) -> int:
    """Run kopf's handlers until stopped (0), the Lease is lost or kopf fails (1)."""
    code = 0
    registry = kopf.OperatorRegistry()
    parts.handlers.register(registry)
    kopf_stop = asyncio.Event()

    @kopf.on.cleanup(registry=registry)
    def raise_stop_flag(**_: object) -> None:
        # On SIGTERM kopf's own signal handler wins (it replaces ours) and its task waiting for this flag
        # stays pending: kopf would then wait 5 s for it as a hung task before returning. Raised here, the
        # operator exits in well under a second (rolling updates, every test's teardown).
        kopf_stop.set()

    operator = asyncio.create_task(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            stop_flag=kopf_stop,
            # Without it kopf derives one from getpass.getuser(), which raises where the process's uid has no
            # passwd entry: the image's 65532 on a Debian base, OpenShift's arbitrary uids.
            identity=Identity(settings.identity),
        )
    )
    watchers = {operator, asyncio.create_task(stop.wait())}
    holding = asyncio.create_task(elector.hold()) if elector is not None else None
    if holding is not None:
        watchers.add(holding)
    done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    if holding is not None and holding in done:
        log.error("leadership lost: stopping so that only the new leader acts")
        code = 1
    elif operator in done and operator.exception() is not None:
        log.error("the kopf operator failed: %r", operator.exception())
        code = 1
    # Otherwise a graceful stop: ours, or kopf's own SIGTERM handling (it replaces our handler).
    kopf_stop.set()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(operator, timeout=10)
    for task in watchers:
        task.cancel()
    return code


def main(argv: list[str] | None = None) -> int:
    """``agentrun-operator`` / ``python -m agentrun_operator``: settings from flags over ``AGENTRUN_OPERATOR_*``."""
    parser = argparse.ArgumentParser(prog="agentrun-operator", description="The agentrun Kubernetes operator.")
    parser.add_argument("--namespace", action="append", help="watch this namespace (repeatable); default: all")
    parser.add_argument("--default-image", help="runner image when an AgentRun names none")
    parser.add_argument("--default-store-secret", help="store Secret when an AgentRun names none")
    parser.add_argument("--log-format", choices=["text", "json"])
    parser.add_argument("--no-leader-election", action="store_true")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {}
    if args.namespace:
        overrides["namespaces"] = args.namespace
    if args.default_image:
        overrides["default_image"] = args.default_image
    if args.default_store_secret:
        overrides["default_store_secret"] = args.default_store_secret
    if args.log_format:
        overrides["log_format"] = args.log_format
    if args.no_leader_election:
        overrides["leader_election"] = False
    settings = OperatorSettings(**overrides)  # type: ignore[arg-type]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))
    _logging(settings.log_format)
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
