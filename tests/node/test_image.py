"""The images ``make image`` builds, run for real with podman (issue 35 item 1).

Guarantees: the demo image runs a graph to completion as the image's own non-root user (65532)
on a read-only root filesystem without network, charging once; each entrypoint the chart and the
operator use starts; the runtime image carries agentrun and nothing of the tests, the development
package, the emulator, pytest or pip, and the demo image adds examples/; a wheelhouse that does not
match the lock's hashes is refused by the build; each OCI archive holds the image in the store; the
pause image sleeps until SIGTERM or SIGINT, exits 0, and reaps the orphans of its pid namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tarfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_operator.decide.podspec import RUNNER_UID
from examples.support_agent import count_effects
from tests.node.conftest import ROOT, Images

pytestmark = pytest.mark.timeout(300)  # a refused build goes as far as its pip step: a minute on a loaded machine

# What a restricted pod gets, as far as podman can say it: no network, no capabilities, no new privileges.
CONFINED = ["--read-only", "--network", "none", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
PAUSE_UID = 65535


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def python_in(image: str, code: str) -> Any:
    """Run ``code`` with the image's python as its own user, confined; return the JSON it printed last."""
    done = podman("run", "--rm", *CONFINED, "--entrypoint", "python", image, "-c", code)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Container names for the test; each is removed (forced, no grace) at the end."""
    made: list[str] = []
    yield made
    for name in made:
        podman("rm", "--force", "--time", "0", name, check=False)


def test_the_demo_image_runs_a_graph_to_completion_as_its_non_root_user_on_a_read_only_root(
    images: Images, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the container's user owns nothing here; what it writes shows who it was
    env = {
        "AGENTRUN_GRAPH": "examples.support_agent:app",
        "AGENTRUN_THREAD_ID": "default/order-4821",
        "AGENTRUN_RUN_NAME": "order-4821",
        "AGENTRUN_RUN_UID": "uid-1",
        "AGENTRUN_ATTEMPT": "1",
        "AGENTRUN_INPUT": json.dumps({"messages": [{"role": "user", "content": "charge my card for order 4821"}]}),
        "AGENTRUN_STORE": "sqlite:////data/agentrun.db",
        "AGENTRUN_METRICS_PORT": "0",
        "AGENTRUN_TERMINATION_LOG": "/data/termination-log",
        "SUPPORT_EFFECTS_DB": "/data/effects.db",
    }
    flags = [f"--env={key}={value}" for key, value in env.items()]
    # The image's own entrypoint and command (python -m agentrun.runner), as a pod runs it.
    done = podman("run", "--rm", *CONFINED, "--volume", f"{data}:/data", *flags, images.demo, check=False)
    assert done.returncode == 0, f"GUARANTEE BROKEN: the runner in the image did not complete: {done.stderr[-3000:]}"
    store = sqlite3.connect(data / "agentrun.db")
    try:
        (row,) = store.execute(
            "SELECT status, current_node FROM states WHERE thread_id = ? ORDER BY version DESC LIMIT 1",
            (env["AGENTRUN_THREAD_ID"],),
        ).fetchall()
    finally:
        store.close()
    assert row == ("completed", "__end__")
    assert count_effects(str(data / "effects.db"))["charges"] == 1
    owners = {path.name: path.stat().st_uid for path in data.iterdir()}
    assert set(owners.values()) == {RUNNER_UID}, f"GUARANTEE BROKEN: written by {owners}, not the image's uid"


@pytest.mark.parametrize(
    ("module", "args", "code", "says"),
    [
        ("agentrun.runner", [], 5, "AGENTRUN_GRAPH"),  # the pod's command, without the operator's environment
        ("agentrun_operator", ["--help"], 0, "usage: agentrun-operator"),
        ("agentrun_history", ["--help"], 0, "usage: python -m agentrun_history"),
    ],
)
def test_each_entrypoint_starts_in_the_runtime_image(
    images: Images, module: str, args: list[str], code: int, says: str
) -> None:
    """The image's ENTRYPOINT is ``python -m``: the chart runs the operator and the history server through it."""
    done = podman("run", "--rm", *CONFINED, images.runtime, module, *args, check=False)
    assert done.returncode == code, done.stderr[-2000:]
    assert says in done.stdout + done.stderr


# Modules the image must hold, and modules it must not (tests, development, emulator, test runner, installers).
WANTED = ["agentrun", "agentrun.runner", "agentrun_operator", "agentrun_history", "mcp", "langchain_core"]
UNWANTED = ["tests", "agentrun_dev", "kubesim", "pytest", "_pytest", "pip", "setuptools", "wheel", "examples"]
PROBE = f"""
import importlib.util, json, os, shutil, sys
import agentrun, agentrun.runner, agentrun_operator.__main__, agentrun_history.__main__
print(json.dumps({{
    "uid": os.getuid(), "gid": os.getgid(),
    "found": {{name: importlib.util.find_spec(name) is not None for name in {WANTED + UNWANTED}}},
    "loaded": sorted(sys.modules), "pip_on_path": shutil.which("pip") or shutil.which("pip3"),
    "examples_dir": os.path.exists("/app/examples"),
}}))
"""


def test_the_runtime_image_holds_agentrun_and_no_test_development_or_installer_code(images: Images) -> None:
    seen = python_in(images.runtime, PROBE)
    assert (seen["uid"], seen["gid"]) == (RUNNER_UID, RUNNER_UID)
    missing = [name for name in WANTED if not seen["found"][name]]
    assert not missing, f"the image lacks {missing}"
    shipped = [name for name in UNWANTED if seen["found"][name]]
    assert not shipped, f"GUARANTEE BROKEN: the runtime image ships {shipped}"
    roots = {name.split(".")[0] for name in seen["loaded"]}
    assert not roots & set(UNWANTED), "importing agentrun loaded test or development code"
    assert seen["pip_on_path"] is None and not seen["examples_dir"]
    config = json.loads(podman("image", "inspect", images.runtime).stdout)[0]["Config"]
    assert config["User"] == f"{RUNNER_UID}:{RUNNER_UID}"


def test_the_demo_image_adds_the_examples_and_nothing_else(images: Images) -> None:
    seen = python_in(
        images.demo,
        "import json, importlib.util as u; import examples.support_agent, examples.mcp_agent;"
        " print(json.dumps({n: u.find_spec(n) is not None for n in ['tests', 'agentrun_dev', 'kubesim', 'pytest']}))",
    )
    assert seen == {"tests": False, "agentrun_dev": False, "kubesim": False, "pytest": False}


def archive_config_digest(archive: Path) -> tuple[str, str]:
    """The reference name and the config digest (the image id) of an OCI archive's only manifest."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> Any:
            member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert member is not None
            return json.load(member)

        index = tar.extractfile("index.json")
        assert index is not None
        (manifest,) = json.load(index)["manifests"]
        config = blob(manifest["digest"])["config"]
        return manifest["annotations"]["org.opencontainers.image.ref.name"], config["digest"]


def test_each_archive_holds_the_image_in_the_store_under_its_name(images: Images) -> None:
    """What ``ctr -n k8s.io images import`` loads is what the tests ran: same name, same image id."""
    for image in (images.runtime, images.demo, images.pause):
        name, config = archive_config_digest(images.archive(image))
        image_id = podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
        assert (name, config) == (image, f"sha256:{image_id}"), f"{images.archive(image)} is stale"


@pytest.mark.parametrize("change", ["a pinned wheel altered", "a pinned wheel missing (made for an older lock)"])
def test_a_wheelhouse_that_does_not_match_the_lock_is_refused(images: Images, tmp_path: Path, change: str) -> None:
    """The build installs only files whose hashes the lock lists: a stale wheelhouse makes no image."""
    wheelhouse = tmp_path / "wheelhouse"
    shutil.copytree(images.cache / "wheelhouse", wheelhouse)
    # requirements/build.txt's wheel, the first thing the build installs: the refusal comes early.
    (pinned,) = wheelhouse.glob("wheel-*.whl")
    if change.startswith("a pinned wheel altered"):
        # Still a valid wheel of the pinned version (pip would install it), but not the file the lock hashed.
        with zipfile.ZipFile(pinned, "a") as wheel:
            wheel.writestr("wheel/_not_in_the_lock.py", "")
        refusal = "DO NOT MATCH THE HASHES"
    else:
        pinned.unlink()
        refusal = "No matching distribution found for wheel=="
    tag = f"localhost/agentrun-stale-wheelhouse:{uuid.uuid4().hex[:8]}"
    try:
        done = podman(
            *("build", "--network", "none", "--target", "runtime", "--tag", tag, "--file", str(ROOT / "Dockerfile")),
            *("--build-arg", f"PYTHON_IMAGE={images.base}", "--build-context", f"wheelhouse={wheelhouse}"),
            *("--build-arg", "PIP_NO_INDEX=1", "--build-arg", "PIP_FIND_LINKS=/wheelhouse", str(ROOT)),
            timeout=280,
            check=False,
        )
        assert done.returncode != 0, f"GUARANTEE BROKEN: an image was built from a wheelhouse with {change}"
        assert refusal in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
        assert podman("image", "exists", tag, check=False).returncode == 1
    finally:
        podman("rmi", "--force", tag, check=False)


def running(name: str) -> bool:
    return podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_pause_image_sleeps_until_sigterm_or_sigint_then_exits_0(
    images: Images, names: list[str], sig: signal.Signals
) -> None:
    config = json.loads(podman("image", "inspect", images.pause).stdout)[0]
    assert config["Config"]["Entrypoint"] == ["/pause"] and config["Config"]["User"] == f"{PAUSE_UID}:{PAUSE_UID}"
    assert len(config["RootFS"]["Layers"]) == 1, "FROM scratch: one layer, the static binary"
    name = f"agentrun-pause-{uuid.uuid4().hex[:8]}"
    names.append(name)
    podman("run", "--detach", "--name", name, *CONFINED, images.pause)
    time.sleep(1)
    assert running(name), podman("logs", name).stderr
    podman("kill", "--signal", sig.name, name)
    assert podman("wait", name, timeout=30).stdout.strip() == "0"
    assert f"got signal {int(sig)}, exiting" in podman("logs", name).stderr


def children_of(pid: int) -> dict[int, str]:
    """Host pid -> state letter of every process whose parent is ``pid``."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended while listed
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = fields[0]
    return found


def test_the_pause_process_reaps_the_orphans_of_its_pid_namespace(images: Images, names: list[str]) -> None:
    """Processes whose parent ends are handed to PID 1 of their namespace (pause): none stays a zombie."""
    sandbox, member = (f"agentrun-{role}-{uuid.uuid4().hex[:8]}" for role in ("pause", "member"))
    names.extend([member, sandbox])
    podman("run", "--detach", "--name", sandbox, *CONFINED, images.pause)
    pause_pid = int(podman("inspect", "--format", "{{.State.Pid}}", sandbox).stdout)
    podman(
        *("run", "--detach", "--name", member, "--pid", f"container:{sandbox}", *CONFINED),
        *("--entrypoint", "sleep", images.runtime, "300"),
    )
    # An exec'd shell starts three sleepers and ends at once: they are orphans, reparented to pause.
    podman("exec", member, "sh", "-c", "for i in 1 2 3; do sleep 2 >/dev/null 2>&1 & done")
    deadline = time.monotonic() + 10
    while len(children_of(pause_pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    orphans = children_of(pause_pid)
    assert len(orphans) == 3, f"the sleepers were not handed to pause (pid {pause_pid}): {orphans}"
    deadline = time.monotonic() + 15
    while children_of(pause_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = children_of(pause_pid)
    assert not left, f"GUARANTEE BROKEN: pause left its ended children as zombies: {left}"
    assert running(sandbox)
    assert os.path.exists(f"/proc/{pause_pid}")
