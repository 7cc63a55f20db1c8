# syntax=docker/dockerfile:1
# One image for both parts: the runner (`python -m agentrun.runner`, the pods' command) and the
# operator (`python -m agentrun_operator`). Not built in this repository's CI (no container
# engine there); `make e2e-kind` builds the `demo` target and loads it into kind.
#
# Targets:
#   runtime (the default, last)  agentrun and its pinned dependencies, with the MCP and LangChain
#                                adapters (agentrun[mcp,langchain], hack/lock.sh); no pip, no examples
#   demo                         runtime + examples/ on the import path (the README's AgentRuns)
#
# Reproducible: every dependency comes from requirements/*.txt, pinned with hashes and
# generated from pyproject.toml by `make lock`; the build fails on any file whose hash differs.
#
# The base image is pinned to an exact Python patch release and Debian suite. Pin it by digest
# as well when releasing, and bump both together:
#   docker buildx imagetools inspect python:3.11.14-slim-trixie
# prints the multi-platform index digest ("Digest: sha256:..."); write it as
#   ARG PYTHON_IMAGE=python:3.11.14-slim-trixie@sha256:<that digest>
# (the index digest, not one platform's manifest, so amd64 and arm64 builds both resolve it).
# A new Python patch release: change the tag, refresh the digest the same way, and run
# `make lock` if the minor version changes (the lock is resolved for CPython 3.11).
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first (their layer survives source changes): wheels only, each checked against
# its hash, into a virtualenv without pip of its own; this stage's pip installs into it.
COPY requirements/ ./requirements/
RUN python -m pip install --require-hashes --no-deps --only-binary :all: -r requirements/build.txt \
    && python -m venv --without-pip /opt/agentrun \
    && python -m pip --python /opt/agentrun/bin/python install \
        --require-hashes --no-deps --only-binary :all: -r requirements/image.txt
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY operator ./operator
# agentrun itself, built with the pinned backend above (no build isolation: nothing unpinned
# is fetched) and installed without dependencies (all of them came from the lock).
RUN python -m pip wheel --no-build-isolation --no-deps --wheel-dir /wheels . \
    && python -m pip --python /opt/agentrun/bin/python install --no-deps --no-index /wheels/agentrun-*.whl

FROM ${PYTHON_IMAGE} AS image
# Nothing installs anything at run time: the base image's pip (and setuptools, wheel) go.
RUN python -m pip uninstall --yes --no-input pip setuptools wheel
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
