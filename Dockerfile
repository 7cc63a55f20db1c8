# One image for both parts: the runner (`python -m agentrun.runner`, the pods' command)
# and the operator (`python -m agentrun_operator`). Not built in this repository's CI
# (no container engine there); `make e2e-kind` builds it and loads it into kind.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
# Graphs referenced by AgentRuns must be importable here; ship your own the same way.
COPY examples ./examples
# The "nonroot" uid the restricted Pod Security profile and the pod builder expect.
USER 65532:65532
ENTRYPOINT ["python", "-m"]
CMD ["agentrun.runner"]
