# syntax=docker/dockerfile:1
# One image for both parts: the runner (`python -m agentrun.runner`, the pods' command) and the
# operator (`python -m agentrun_operator`). Built on this project's machines by `make image`
# (hack/image/build.sh: podman, no Docker, no registry; the tests/node tier runs it), and by
# `make e2e-kind` with Docker (the `demo` target, loaded into kind).
#
# Targets:
#   runtime (the default, last)  agentrun and its pinned dependencies, with the MCP and LangChain
#                                adapters (agentrun[mcp,langchain], hack/lock.sh); no pip, no examples
#   demo                         runtime + examples/ on the import path (the README's AgentRuns)
#
# Reproducible: every dependency comes from requirements/*.txt, pinned with hashes and
# generated from pyproject.toml by `make lock`; the build fails on any file whose hash differs.
# Where the files come from: the package index by default; a wheelhouse made beforehand when the
# build names one (no network inside the build), as hack/image/build.sh does:
#   --build-context wheelhouse=DIR --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheelhouse
# The hashes still decide: a wheelhouse made for another lock is refused.
#
# The base image is pinned to an exact Python patch release and Debian suite. Pin it by digest
# as well when releasing, and bump both together:
#   docker buildx imagetools inspect python:3.11.14-slim-trixie
# prints the multi-platform index digest ("Digest: sha256:..."); write it as
#   ARG PYTHON_IMAGE=python:3.11.14-slim-trixie@sha256:<that digest>
# (the index digest, not one platform's manifest, so amd64 and arm64 builds both resolve it).
# A new Python patch release: change the tag, refresh the digest the same way, and run
# `make lock` if the minor version changes (the lock is resolved for CPython 3.11).
# Where that base cannot be pulled, hack/image/base.sh builds one from Debian's packages
# (bookworm's python3.11) and build.sh passes it as PYTHON_IMAGE. The two differ, and every
# command below works on both: Debian's interpreter is only `python3` (no `python`), has no pip
# installed, and is externally managed (PEP 668), so everything installs into virtualenvs.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# The wheelhouse: empty unless the build names a folder of wheels for it (--build-context).
FROM scratch AS wheelhouse

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# The build's own pip in a virtualenv (from the interpreter's ensurepip wheels, offline), and the
# one the image keeps, without pip.
RUN python3 -m venv /opt/build && python3 -m venv --without-pip /opt/agentrun
# Set by a build from a wheelhouse (after the venvs: ensurepip must not look there).
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
WORKDIR /src
# Dependencies first (their layer survives source changes): wheels only, each checked against
# its hash; the build venv's pip installs into /opt/agentrun.
COPY requirements/ ./requirements/
COPY --from=wheelhouse / /wheelhouse/
RUN /opt/build/bin/python -m pip install --require-hashes --no-deps --only-binary :all: -r requirements/build.txt \
    && /opt/build/bin/python -m pip --python /opt/agentrun/bin/python install \
        --require-hashes --no-deps --only-binary :all: -r requirements/image.txt
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY operator ./operator
# agentrun itself, built with the pinned backend above (no build isolation: nothing unpinned
# is fetched) and installed without dependencies (all of them came from the lock).
RUN /opt/build/bin/python -m pip wheel --no-build-isolation --no-deps --wheel-dir /wheels . \
    && /opt/build/bin/python -m pip --python /opt/agentrun/bin/python install --no-deps --no-index /wheels/agentrun-*.whl

FROM ${PYTHON_IMAGE} AS image
# Nothing installs anything at run time: the upstream base's pip (and setuptools, wheel) go;
# Debian's python3 has none installed. Either way the build fails if pip is still importable.
RUN if python3 -m pip --version >/dev/null 2>&1; then python3 -m pip uninstall --yes --no-input pip setuptools wheel; fi \
    && ! python3 -c 'import pip' 2>/dev/null
ENV PATH=/opt/agentrun/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app
COPY --from=build /opt/agentrun /opt/agentrun
# Graphs referenced by AgentRuns must be importable: put yours under /app in an image built
# FROM this one (the demo target below does it with examples/).
WORKDIR /app
# The "nonroot" uid the restricted Pod Security profile and the pod builder expect.
USER 65532:65532
ENTRYPOINT ["python", "-m"]
CMD ["agentrun.runner"]

FROM image AS demo
COPY examples ./examples

# The default target (last): the runtime image without examples.
FROM image AS runtime
