#!/usr/bin/env bash
# `make lock`: pin the image's Python dependencies, with hashes, from pyproject.toml.
#
#   requirements/image.txt  [project] dependencies and the extras in IMAGE_EXTRAS: what the image installs
#                           (pip --require-hashes), so a graph using MCP servers or LangChain tools runs in it
#   requirements/build.txt  [build-system] requires: the backend that builds agentrun's own wheel
#
# Resolved for the image's interpreter (CPython 3.11 on Linux, the Dockerfile's base image), not
# for this machine. Existing pins are kept while they still satisfy pyproject.toml; pass
# `--upgrade` (make lock LOCK_ARGS=--upgrade) to move everything to the newest allowed versions,
# or `--upgrade-package NAME` for one. Every distribution file of a pinned version is hashed,
# so the lock serves amd64 and arm64 builds alike.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
cd "$ROOT"
[[ -x "$BIN/uv" ]] || { echo "lock: $BIN/uv not found; run 'make dev' (uv is in the dev extra)" >&2; exit 1; }

compile() {
    "$BIN/uv" pip compile --quiet --generate-hashes --only-binary :all: \
        --python-version 3.11 --python-platform linux \
        --custom-compile-command "make lock" "$@"
}

# The adapters the runner image carries (pyproject.toml's optional-dependencies; tests/chart/test_dockerfile.py
# checks the lock pins each of their requirements). LangGraph is not among them: see README, "Bring your LangGraph graph".
IMAGE_EXTRAS=(mcp langchain)
compile pyproject.toml "${IMAGE_EXTRAS[@]/#/--extra=}" -o requirements/image.txt
"$BIN/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
    | compile - -o requirements/build.txt
