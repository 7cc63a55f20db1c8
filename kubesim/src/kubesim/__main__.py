"""``python -m kubesim``: serve the emulated cluster (and optionally the kubelet stand-in) until Ctrl-C.

Here rather than in ``emulator`` (the API server itself): it also writes a kubeconfig (``cluster``) and
starts the kubelet stand-in (``kubelet``), which build on the emulator.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import kmock

from kubesim import emulator
from kubesim.cluster import write_kubeconfig
from kubesim.emulator import KOPF_PEERING_CRDS, ClusterEmulator
from kubesim.kubelet import Kubelet


def main(argv: list[str] | None = None) -> None:
    """``python -m kubesim``: serve the emulated cluster until Ctrl-C (``--help`` for the options)."""
    parser = argparse.ArgumentParser(prog="python -m kubesim", description=(emulator.__doc__ or "").split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--crd",
        type=Path,
        action="append",
        default=[],
        help="a CRD file, or a folder of *.yaml CRD files, installed at start (repeatable)",
    )
    parser.add_argument("--kopf-peerings", action="store_true", help="also install kopf's peering CRDs")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the emulator here")
    parser.add_argument("--kubelet", action="store_true", help="also run the kubelet stand-in (runs pods locally)")
    parser.add_argument("--workdir", type=Path, default=Path(".demo/kubelet"), help="kubelet pod logs and dirs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio.run(_serve_forever(args))


async def _serve_forever(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    crd_files = [f for path in args.crd for f in (sorted(path.glob("*.yaml")) if path.is_dir() else [path])]
    if args.kopf_peerings:
        crd_files.append(KOPF_PEERING_CRDS)
    server_app = ClusterEmulator(crd_files=crd_files)
    async with server_app, kmock.Server(server_app, host=args.host, port=args.port) as server:
        url = f"http://{server.host}:{server.port}"
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, url)
        kubelet = Kubelet(url, workdir=args.workdir) if args.kubelet else None
        if kubelet is not None:
            await kubelet.start()
        print(
            f"emulated cluster serving at {url}" + (f", kubeconfig {args.kubeconfig}" if args.kubeconfig else ""),
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            if kubelet is not None:
                await kubelet.stop()
            server_app.close_streams()


if __name__ == "__main__":
    main(sys.argv[1:])
