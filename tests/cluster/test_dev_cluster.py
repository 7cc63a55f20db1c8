"""``make cluster`` (``agentrun-dev``): a local cluster a user keeps, started the way a user starts it.

The test runs the real ``make cluster`` as a subprocess in its own process
group (as a terminal would), uses the KUBECONFIG it prints with the real
kubectl, runs a graph module that lives in a temporary folder on PYTHONPATH
(no image, nothing in this repository), and presses Ctrl-C (SIGINT to the
group): every process the cluster started must be gone, checked by pid.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agentrun_dev.servers import free_port
from kubesim import KUBECTL
from tests.cluster.processes import alive, descendants

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

GRAPH = textwrap.dedent(
    '''
    """A user's own graph, outside the repository: greets, or sleeps when asked to (a run to interrupt)."""
    import time

    from agentrun import END, START, StateGraph, assistant


    def greet(state):
        text = state["messages"][-1].content
        if text == "sleep":
            time.sleep(3600)
        return {"messages": [assistant(f"hello from {__name__}: {text}")]}


    graph = StateGraph()
    graph.add_node("greet", greet)
    graph.add_edge(START, "greet")
    graph.add_edge("greet", END)
    app = graph.compile()
    '''
)


def sigint_as_in_a_terminal() -> None:
    """In the child: SIGINT's default action, as a terminal's foreground job has it. A suite started as a
    background job (a CI runner, nohup) hands its children SIGINT ignored, and a Ctrl-C test then tests that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def path_without_venv() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != BIN)


class DevCluster:
    """``make cluster`` as a subprocess: its output read line by line, the group signalled as a terminal does."""

    def __init__(
        self,
        workdir: Path,
        pythonpath: Path,
        port: int,
        api_server: str = "kubesim",
        *,
        venv_on_path: bool = True,
        started: subprocess.Popen[bytes] | None = None,
    ) -> None:
        """``make cluster`` with these settings, or the output of ``started`` (another way it was started)."""
        self.proc = started or self._make_cluster(workdir, pythonpath, port, api_server, venv_on_path)
        self.output = ""
        self._selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    @staticmethod
    def _make_cluster(
        workdir: Path, pythonpath: Path, port: int, api_server: str, venv_on_path: bool
    ) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_", "MAKE"))}
        env.update(
            AGENTRUN_DEV_K8S=api_server,
            AGENTRUN_DEV_PORT=str(port),
            AGENTRUN_DEV_WORKDIR=str(workdir),
            # The SQLite store (no history server): the default, this machine's database agentrun_dev, is a
            # person's; the PostgreSQL default is tested on a database of its own, below.
            AGENTRUN_DEV_STORE="sqlite",
            PYTHONPATH=str(pythonpath),
            # Without the virtualenv: a terminal where it was never activated, as after a fresh clone.
            PATH=os.pathsep.join([str(BIN), env.get("PATH", "")]) if venv_on_path else path_without_venv(),
        )
        # -o: the virtualenv counts as installed (no pip run by a test, whatever pyproject.toml's timestamp).
        return subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "cluster"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,
        )

    def read_until(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (match := re.search(pattern, self.output, re.MULTILINE)) is None:
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self._drain(0)):
                raise AssertionError(f"make cluster never printed {pattern!r}; output so far:\n{self.output}")
            self._drain(0.2)
        return match

    def _drain(self, timeout: float) -> bool:
        got = False
        for key, _ in self._selector.select(timeout):
            data = key.fileobj.read()  # type: ignore[union-attr]
            if data:
                self.output += data.decode(errors="replace")
                got = True
        return got

    def interrupt(self, timeout: float = 60) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        code = self.proc.wait(timeout)
        self._drain(0)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._selector.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(params=["kubesim", "real"])
def dev_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[DevCluster, Path]]:
    """``make cluster`` on kubesim, and with ``AGENTRUN_DEV_K8S=real`` on the real control plane (issue 25 item 6)."""
    graphs = tmp_path / "my-graphs"
    graphs.mkdir()
    (graphs / "my_greeter.py").write_text(GRAPH)
    started = DevCluster(tmp_path / "dev", graphs, free_port(), api_server=request.param)
    try:
        yield started, graphs
    finally:
        started.kill()


def kubectl(kubeconfig: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["KUBECONFIG"] = kubeconfig
    return subprocess.run([KUBECTL, *args], input=input, capture_output=True, text=True, env=env, timeout=60)


def run_manifest(name: str, text: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {
                "graph": "my_greeter:app",
                "threadId": name,
                "input": {"messages": [{"role": "user", "content": text}]},
            },
        }
    )


def phase_of(kubeconfig: str, name: str) -> str:
    return kubectl(kubeconfig, "get", "ar", name, "-o", "jsonpath={.status.phase}").stdout.strip()


def wait_phase(kubeconfig: str, name: str, phase: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (seen := phase_of(kubeconfig, name)) != phase:
        if time.monotonic() > deadline:
            described = kubectl(kubeconfig, "describe", "ar", name).stdout
            raise AssertionError(f"{name} is {seen or 'without a phase'}, never {phase}:\n{described}")
        time.sleep(0.2)


def test_make_cluster_runs_a_users_graph_and_ctrl_c_leaves_no_process(
    dev_cluster: tuple[DevCluster, Path], tmp_path: Path
) -> None:
    dev, _ = dev_cluster
    dev.read_until(r"^starting the local cluster:.* - ready$")
    kubeconfig = dev.read_until(r"^export KUBECONFIG=(\S+)$").group(1)
    assert kubeconfig == str((tmp_path / "dev" / "kubeconfig").resolve())
    examples = re.findall(r"^  (kubectl .+)$", dev.read_until(r"Ctrl-C stops").string, re.MULTILINE)
    assert len(examples) == 3, f"three example commands: {dev.output}"

    shown = kubectl(kubeconfig, "get", "agentruns")
    assert shown.returncode == 0 and "No resources found" in shown.stderr, shown
    applied = kubectl(kubeconfig, "apply", "-f", "-", input=run_manifest("hello", "hi"))
    assert applied.returncode == 0, applied.stderr
    wait_phase(kubeconfig, "hello", "Succeeded")
    answer = kubectl(kubeconfig, "get", "ar", "hello", "-o", "jsonpath={.status.result.message}").stdout
    assert answer == "hello from my_greeter: hi", "the graph module from the temporary folder must have run"
    no_history = plugin(kubeconfig, "history", "hello")  # SQLite: why, not a port-forward to a chart's Service
    assert no_history.returncode == 1, no_history
    assert "this cluster has no history server: the store of make cluster is SQLite (AGENTRUN_DEV_STORE=sqlite)" in (
        no_history.stderr
    ), no_history.stderr

    # A runner still running when Ctrl-C comes: it must go too.
    assert kubectl(kubeconfig, "apply", "-f", "-", input=run_manifest("sleeper", "sleep")).returncode == 0
    wait_phase(kubeconfig, "sleeper", "Running")
    pids = descendants(dev.proc.pid)
    runner = [p for p in pids if b"agentrun.runner" in Path(f"/proc/{p}/cmdline").read_bytes()]
    operator = [p for p in pids if b"agentrun_operator" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert runner and operator, f"the runner and the operator must be processes of make cluster: {pids}"

    # make waits for agentrun-dev, then dies of the SIGINT itself (as after a Ctrl-C in a terminal).
    assert dev.interrupt() in (0, 130, -signal.SIGINT), dev.output
    assert "stopped." in dev.output, dev.output
    left = sorted(p for p in pids if alive(p))
    assert not left, f"processes left behind after Ctrl-C: {left}"


def test_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [str(BIN / "agentrun-dev"), "--port", str(port), "--workdir", str(tmp_path / "dev")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2, result
    assert f"port {port} on 127.0.0.1 is taken" in result.stderr and "AGENTRUN_DEV_PORT" in result.stderr
    assert not (tmp_path / "dev").exists(), "nothing may start when the port is taken"


def test_a_missing_kubectl_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no kubectl anywhere on PATH
    result = subprocess.run(
        [sys.executable, "-m", "agentrun_dev.cluster", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2, result
    assert "kubectl is not on PATH" in result.stderr, result.stderr


def test_make_cluster_prints_the_export_path_line_that_makes_kubectl_agentrun_work(tmp_path: Path) -> None:
    """Issue 24 item 7: the banner's ``kubectl agentrun watch`` must work in a terminal without the virtualenv."""
    graphs = tmp_path / "my-graphs"
    graphs.mkdir()
    dev = DevCluster(tmp_path / "dev", graphs, free_port(), venv_on_path=False)
    try:
        dev.read_until(r"Ctrl-C stops")
        kubeconfig = dev.read_until(r"^export KUBECONFIG=\S+$").group(0)
        path_line = dev.read_until(r"^export PATH=\S+:\$PATH$").group(0)
        assert path_line == f"export PATH={BIN}:$PATH", dev.output
        terminal = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        terminal["PATH"] = path_without_venv()

        def shell(*lines: str) -> subprocess.CompletedProcess[str]:
            script = "\n".join([*lines, "kubectl agentrun list"])
            return subprocess.run(["bash", "-c", script], env=terminal, capture_output=True, text=True, timeout=60)

        before = shell(kubeconfig)
        assert before.returncode != 0 and 'unknown command "agentrun"' in before.stderr, before
        after = shell(kubeconfig, path_line)
        assert after.returncode == 0, f"the printed lines must make kubectl agentrun work: {after}"
        assert dev.interrupt() in (0, 130, -signal.SIGINT), dev.output
    finally:
        dev.kill()


def test_no_path_line_when_the_plugin_is_already_found() -> None:
    from agentrun_dev.cluster import plugin_path_line

    assert plugin_path_line(str(BIN)) is None, "the virtualenv is on PATH: nothing to export"
    assert plugin_path_line(path_without_venv()) == f"export PATH={BIN}:$PATH"


TICKER = textwrap.dedent(
    '''
    """A graph that keeps making progress: a step every 0.3 s (the history's live view has something to say)."""
    import time

    from agentrun import END, START, StateGraph, assistant


    def tick(state):
        time.sleep(0.3)
        return {"messages": [assistant("tick")]}


    graph = StateGraph()
    graph.add_node("tick", tick)
    graph.add_edge(START, "tick")
    graph.add_conditional_edges("tick", lambda state: "tick" if len(state["messages"]) < 400 else END)
    app = graph.compile()
    '''
)


def agentrun_dev(cwd: Path, api_server: str, dsn: str) -> subprocess.Popen[bytes]:
    """``agentrun-dev`` as a person starts it in a folder of theirs: no work folder named, no store variable but
    the database (one that does not exist yet, so the test can drop it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_", "MAKE"))}
    env.update(AGENTRUN_DEV_K8S=api_server, AGENTRUN_DEV_PORT=str(free_port()), AGENTRUN_DEV_POSTGRES_DSN=dsn)
    env.pop("PYTHONPATH", None)
    return subprocess.Popen(
        [str(BIN / "agentrun-dev")],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def plugin(kubeconfig: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ...`` in a terminal with only the printed ``export KUBECONFIG`` line (no ``--server``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=kubeconfig, PATH=os.pathsep.join([str(BIN), path_without_venv()]))
    return subprocess.run([KUBECTL, "agentrun", *args], capture_output=True, text=True, env=env, timeout=timeout)


def state_version(kubeconfig: str, name: str) -> int:
    return int(kubectl(kubeconfig, "get", "ar", name, "-o", "jsonpath={.status.stateVersion}").stdout.strip() or 0)


@pytest.mark.real_server
def test_agentrun_dev_started_in_any_folder_shows_the_history_without_flags(api_server: str, tmp_path: Path) -> None:
    """Issue 32 item 6, a fresh clone's path: ``agentrun-dev`` in a folder of the user's with its default, relative
    work folder (the real control plane read it twice: kube-controller-manager exited), the store's database
    created, ``kubectl agentrun history`` and ``ui`` finding the history server with no ``--server``, a thread id
    for a run name answered with the run's name, and a live view closed without a traceback in ``ui``."""
    from agentrun_dev.databases import drop_database, postgres_dsn, with_database

    home = tmp_path / "my-agents"
    home.mkdir()
    (home / "my_greeter.py").write_text(GRAPH)
    (home / "my_ticker.py").write_text(TICKER)
    database = f"agentrun_devtest_{os.getpid()}_{free_port()}"
    dsn = with_database(postgres_dsn(), database)
    dev = DevCluster(home / ".agentrun-dev", home, 0, started=agentrun_dev(home, api_server, dsn))
    try:
        dev.read_until(r"Ctrl-C stops", timeout=150)
        kubeconfig = dev.read_until(r"^export KUBECONFIG=(\S+)$").group(1)
        assert kubeconfig == str(home / ".agentrun-dev" / "kubeconfig"), dev.output
        assert re.search(r"store PostgreSQL \(AGENTRUN_DEV_POSTGRES_DSN, created now\)", dev.output), dev.output
        assert "--server" not in dev.output, "the banner's commands need no --server"

        greet = run_manifest("greet-order-1", "hi").replace("threadId: greet-order-1", "threadId: order-1")
        assert kubectl(kubeconfig, "apply", "-f", "-", input=greet).returncode == 0
        wait_phase(kubeconfig, "greet-order-1", "Succeeded")
        shown = plugin(kubeconfig, "history", "greet-order-1", "-o", "json")
        assert shown.returncode == 0, shown
        history = yaml.safe_load(shown.stdout)
        assert history["thread_id"].endswith("order-1") and [s["node"] for s in history["steps"]][:1] == ["greet"], (
            history
        )
        table = plugin(kubeconfig, "history", "greet-order-1")
        assert table.returncode == 0 and "greet" in table.stdout, table
        by_thread = plugin(kubeconfig, "history", "order-1")
        assert by_thread.returncode == 1, by_thread
        assert "'order-1' is the threadId of greet-order-1: kubectl agentrun history greet-order-1" in (
            by_thread.stderr
        ), by_thread.stderr

        ticker = yaml.safe_load(run_manifest("ticker", "go"))
        ticker["spec"].update(graph="my_ticker:app", config={"recursionLimit": 1000})
        assert kubectl(kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(ticker)).returncode == 0
        wait_phase(kubeconfig, "ticker", "Running")
        closed_a_live_view_in_ui(kubeconfig, tmp_path)

        assert dev.interrupt() == 0, dev.output
    finally:
        dev.kill()
        asyncio.run(drop_database(dsn))


def closed_a_live_view_in_ui(kubeconfig: str, tmp_path: Path) -> None:
    """``kubectl agentrun ui``: a live view of the ticking run opened through it and closed (a tab closing) while
    the run goes on; the proxy must say nothing about it (it printed aiohttp's "Cannot write to closing
    transport" traceback)."""
    log = tmp_path / "ui.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=kubeconfig, PATH=os.pathsep.join([str(BIN), path_without_venv()]))
    with log.open("wb") as out:
        ui = subprocess.Popen(
            [KUBECTL, "agentrun", "ui", "--port", "0", "--no-browser"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=sigint_as_in_a_terminal,
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text())):
            assert ui.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        port = int(found.group(1))
        for _ in range(3):  # three tabs, each closed after its first event
            stream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            stream.request("GET", "/runs/default/ticker/events")
            response = stream.getresponse()
            assert response.status == 200, (response.status, response.read())
            assert response.readline().startswith(b"event: update"), "a live view gets an update"
            stream.close()
        # The server keeps writing to the proxy while the run goes on: wait for a few steps more.
        seen = state_version(kubeconfig, "ticker")
        while state_version(kubeconfig, "ticker") < seen + 10:
            assert time.monotonic() < deadline + 60, "the ticker stopped ticking"
            time.sleep(0.3)
        time.sleep(3)  # the history server's poll (2 s) writes the update the proxy can no longer deliver
        assert ui.poll() is None, log.read_text()
    finally:
        ui.send_signal(signal.SIGINT)
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.wait()
            # Seen in CI when the tier ran as a script's background job, whose SIGINT is ignored and inherited
            # (hack/test_tiers.sh now restores it): Ctrl-C must end ui.
            raise AssertionError(f"kubectl agentrun ui outlived Ctrl-C by 30 s:\n{log.read_text()}") from None
    said = log.read_text()
    assert "Traceback" not in said and "Error handling request" not in said, said


def test_the_dev_store_is_postgresql_created_when_missing_and_sqlite_only_when_none_answers(tmp_path: Path) -> None:
    """``agentrun-dev``'s store choice (``agentrun_dev.dev_store``) on this machine's PostgreSQL and a closed port."""
    from agentrun_dev.databases import drop_database, postgres_dsn, with_database
    from agentrun_dev.dev_store import DEFAULT_DSN, StoreError, choose_store

    assert DEFAULT_DSN == "postgresql://postgres@127.0.0.1:5432/agentrun_dev", "the server scripts/services.sh starts"
    dsn = with_database(postgres_dsn(), f"agentrun_devtest_{os.getpid()}_{free_port()}")
    try:
        first = choose_store(tmp_path, default_dsn=dsn)
        again = choose_store(tmp_path, default_dsn=dsn)
        assert (first.url, first.postgres, first.created) == (dsn, True, True)
        assert (again.postgres, again.created) == (True, False), "an existing database is used as it is"
        named = choose_store(tmp_path, postgres_dsn=dsn + "?agentrun_listen=off")
        assert named.postgres and named.url.endswith("agentrun_listen=off"), "agentrun's parameters stay in the URL"
    finally:
        asyncio.run(drop_database(dsn))

    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/agentrun_dev"
    fallback = choose_store(tmp_path, default_dsn=closed)
    assert fallback.url == f"sqlite:///{tmp_path / 'agentrun.db'}" and not fallback.postgres
    assert "bash scripts/services.sh" in fallback.why_not_postgres and "AGENTRUN_DEV_POSTGRES_DSN" in (
        fallback.why_not_postgres
    )
    with pytest.raises(StoreError, match=r"start the server .*createdb .*AGENTRUN_DEV_POSTGRES_DSN"):
        choose_store(tmp_path, postgres_dsn=closed)  # named: never a silent SQLite
    with pytest.raises(StoreError, match="both set"):
        choose_store(tmp_path, store="sqlite", postgres_dsn=dsn)
    assert not choose_store(tmp_path, store="sqlite").postgres
