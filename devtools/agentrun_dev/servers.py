"""Private servers for tests and benchmarks: a PostgreSQL, a redis-server and a PgBouncer of one's own, on free ports.

A test or a fault campaign that stops, kills or restarts the store must not touch the machine's shared
servers: these run from a temporary directory on a free 127.0.0.1 port and are gone after ``destroy()``
(PostgreSQL) or ``stop()``/``kill()`` (Redis). Not used by the runtime itself.

HAZARD: PostgreSQL runs with ``fsync=off`` and Redis without persistence; a restart here is a clean stop
and start (``pg_ctl -m fast``, Redis SHUTDOWN), never a power cut. PgBouncer trusts every loopback client
(``auth_type = trust``): a test fixture, never a deployment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (another process may take it before the caller binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Returns once 127.0.0.1:``port`` accepts; raises ``RuntimeError`` after ``timeout`` or if ``process`` ends."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline or (process is not None and process.poll() is not None):
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes] | None, sig: signal.Signals, grace: float = 10) -> None:
    """Send ``sig`` to a running ``process`` (a server's own shutdown signal) and SIGKILL it after ``grace`` s."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def pg_bin(name: str) -> str:
    """A PostgreSQL program (``initdb``, ``pg_ctl``, ``psql``): Debian's newest version, else from PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"{name} not found under /usr/lib/postgresql/*/bin or on PATH")
    return on_path


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (initdb in a temporary directory, a free port) to stop and start at will.

    ``settings`` are extra server settings (``-c name=value``); ``timeout`` bounds each ``pg_ctl`` call.
    PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` OS user.
    ``listen``: more addresses than 127.0.0.1 to listen on (a real node's pods reach the host's address on the
    node's link, ``kubesim.node``); ``hba``: ``pg_hba.conf`` lines appended (say, password access for the pods'
    subnet: loopback alone is trusted).
    """

    def __init__(
        self,
        *,
        settings: Mapping[str, str] = {},
        timeout: int = 30,
        prefix: str = "agentrun-pg-",
        listen: Sequence[str] = (),
        hba: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.listen = ("127.0.0.1", *listen)
        self.hba = tuple(hba)
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.settings = dict(settings)
        self.timeout = timeout
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def dsn(self) -> str:
        """The superuser's DSN on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as_user, *cmd], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        """Create the data directory (``initdb``, trust authentication)."""
        self._run(pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        if self.hba:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write("".join(line + "\n" for line in self.hba))

    def start(self) -> None:
        """Start the server on its port and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses={','.join(self.listen)} -c fsync=off"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        pg_ctl = pg_bin("pg_ctl")
        self._run(
            pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", str(self.timeout), "start"
        )

    def stop(self) -> None:
        # fast: every client disconnected, open transactions rolled back, a clean shutdown.
        """A clean fast shutdown: clients disconnected, open transactions rolled back."""
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", str(self.timeout), "stop")

    def sql(self, statement: str) -> None:
        """Run ``statement`` with psql as the superuser, over TCP."""
        psql = [pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres"]
        subprocess.run([*psql, "-v", "ON_ERROR_STOP=1", "-c", statement], check=True, capture_output=True, timeout=30)

    def destroy(self) -> None:
        """Stop it at once if it runs, and remove its files."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[PrivatePostgres]:
        """Initialised and started for the ``with`` block; destroyed after it."""
        try:
            self.init()
            self.start()
            yield self
        finally:
            self.destroy()


class PrivateRedis:
    """A redis-server without persistence, in ``root``; ``stop()`` and ``start()`` keep its port.

    ``listen``: more addresses than 127.0.0.1 (as ``PrivatePostgres``); ``password``: required of every client
    (``requirepass``), in the URL too.
    """

    def __init__(self, root: Path, *, listen: Sequence[str] = (), password: str | None = None) -> None:
        self.port = free_port()
        self.root = root
        self.listen = ("127.0.0.1", *listen)
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's Redis URL (database 0)."""
        return self.url_at("127.0.0.1")

    def url_at(self, host: str) -> str:
        """The server's Redis URL at one of its addresses, with the password when it has one."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{host}:{self.port}/0"

    def start(self) -> None:
        """Start redis-server without persistence on its port and wait until it answers."""
        self.root.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", *self.listen, "--save", "", "--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            [*argv, "--dir", str(self.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port, 10, self.process)

    def stop(self) -> None:
        """SIGTERM: redis-server shuts down (nothing to save), SIGKILL after 10 s."""
        stop_process(self.process, signal.SIGTERM)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the server is gone mid-whatever, as a crash leaves it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


def pgbouncer_bin() -> str:
    """Debian's ``pgbouncer`` (``scripts/pgbouncer.sh`` installs it); raises ``RuntimeError`` when missing."""
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
    if found is None:
        raise RuntimeError("pgbouncer not found: bash scripts/pgbouncer.sh (apt-get install pgbouncer)")
    return found


class PrivatePgBouncer:
    """A PgBouncer process of one's own in front of the PostgreSQL at ``server_port``, in transaction mode.

    Every database name is forwarded (``* = host=127.0.0.1 port=...``), so a client's DSN only changes its
    port. ``pool_size``: server connections per database and user; ``max_db_connections``: per database, all
    users (0: no cap). Trust authentication on loopback; as root it runs as the ``postgres`` OS user
    (PgBouncer refuses to run as root). ``dsn(database)`` is a client's URL, ``agentrun_pooler=transaction`` in it.
    """

    def __init__(
        self,
        server_port: int,
        *,
        pool_size: int = 20,
        max_db_connections: int = 0,
        max_client_conn: int = 4000,
        prefix: str = "agentrun-pgbouncer-",
    ) -> None:
        self.port = free_port()
        self.server_port = server_port
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.log = self.root / "pgbouncer.log"
        self.pool_size = pool_size
        self.max_db_connections = max_db_connections
        self.max_client_conn = max_client_conn
        self.process: subprocess.Popen[bytes] | None = None
        # As root: the child itself switches to postgres (no runuser in between, whose exit would leave
        # pgbouncer running: stop() signals the process it started).
        self._user: str | None = None
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
            self._user = "postgres"

    def dsn(self, database: str = "postgres", *, user: str = "postgres") -> str:
        """A DSN of ``database`` as ``user`` through the pooler, marked ``agentrun_pooler=transaction``."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}?agentrun_pooler=transaction"

    def _config(self) -> str:
        users = self.root / "userlist.txt"
        users.write_text('"postgres" ""\n')
        return "\n".join(
            [
                "[databases]",
                f"* = host=127.0.0.1 port={self.server_port}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {users}",
                "pool_mode = transaction",
                f"default_pool_size = {self.pool_size}",
                f"max_db_connections = {self.max_db_connections}",
                f"max_client_conn = {self.max_client_conn}",
                "admin_users = postgres",
                f"logfile = {self.log}",
                "log_connections = 0",
                "log_disconnections = 0",
                "",
            ]
        )

    def start(self) -> None:
        """Write the configuration, start PgBouncer and wait until it accepts connections."""
        ini = self.root / "pgbouncer.ini"
        ini.write_text(self._config())
        if self._user:
            for path in self.root.iterdir():
                shutil.chown(path, user="postgres")
        self.process = subprocess.Popen(
            [pgbouncer_bin(), str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self._user,
            group=self._user,
            extra_groups=[] if self._user else None,
        )
        try:
            wait_for_port(self.port, 10, self.process)
        except RuntimeError:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"pgbouncer did not start on 127.0.0.1:{self.port}: {log}") from None

    def stop(self) -> None:
        """SIGINT: PgBouncer's safe shutdown (SIGKILL after 10 s)."""
        stop_process(self.process, signal.SIGINT)
        self.process = None

    def destroy(self) -> None:
        """Stop PgBouncer and delete its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[PrivatePgBouncer]:
        """Started for the ``with`` block; stopped and its files removed after it."""
        try:
            self.start()
            yield self
        finally:
            self.destroy()
