"""``python -m agentrun_history``: the run history server (settings: ``AGENTRUN_HISTORY_*`` or flags).

The store DSN comes from ``AGENTRUN_HISTORY_POSTGRES_DSN`` (the chart sets it
from the store Secret's ``postgresDsn``), never from a flag, so it shows in
no process list.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web
from pydantic_settings import BaseSettings, SettingsConfigDict

from .kube import UserKube
from .server import make_app
from .store import HistoryStore, ProgressHub


class HistorySettings(BaseSettings):
    """The history server's settings (``AGENTRUN_HISTORY_*``): where it listens, the store, TLS, token login."""

    model_config = SettingsConfigDict(env_prefix="AGENTRUN_HISTORY_", extra="ignore")

    postgres_dsn: str = ""
    # The direct DSN for LISTEN when postgres_dsn goes through a transaction pooler (the Secret's postgresListenDsn).
    postgres_listen_dsn: str = ""
    host: str = "0.0.0.0"
    port: int = 8080
    # In a pod: the API server's CA (the chart mounts the kube-root-ca.crt ConfigMap here, no token).
    kube_ca_file: str = "/etc/agentrun/kube-ca/ca.crt"
    # A login form that keeps a pasted token in an HttpOnly cookie (shared installs behind TLS).
    token_login: bool = False
    # TLS is terminated in front of this server (the chart's ingress with TLS, or your own proxy): the sign-in
    # cookie is Secure, and a token may be signed in through it.
    tls_in_front: bool = False
    # Sign a token in over plain HTTP from anywhere, not only from loopback (the token crosses the network in clear).
    allow_plain_http_login: bool = False
    tls_cert_file: str = ""
    tls_key_file: str = ""
    log_level: str = "INFO"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentrun_history``: serve the run history until stopped; returns the exit code."""
    settings = HistorySettings()
    parser = argparse.ArgumentParser(prog="python -m agentrun_history", description=__doc__)
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    parser.add_argument("--token-login", action="store_true", default=settings.token_login)
    parser.add_argument("--tls-in-front", action="store_true", default=settings.tls_in_front)
    parser.add_argument("--allow-plain-http-login", action="store_true", default=settings.allow_plain_http_login)
    args = parser.parse_args(argv)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not settings.postgres_dsn:
        print("error: AGENTRUN_HISTORY_POSTGRES_DSN is not set (the store's postgresDsn)", file=sys.stderr)
        return 2
    tls: ssl.SSLContext | None = None
    if settings.tls_cert_file:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
    app = make_app(
        kube=UserKube.from_environment(ca_file=settings.kube_ca_file),
        store=HistoryStore(settings.postgres_dsn),
        hub=ProgressHub(settings.postgres_dsn, listen=settings.postgres_listen_dsn or None),
        token_login=args.token_login,
        secure_cookie=tls is not None or args.tls_in_front,
        plain_http_login=args.allow_plain_http_login,
    )
    web.run_app(app, host=args.host, port=args.port, ssl_context=tls, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
