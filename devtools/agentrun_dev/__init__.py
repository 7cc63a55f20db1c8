"""agentrun on one machine, for development, tests, benchmarks and the demo: never in the runtime image.

Its own distribution (``devtools/pyproject.toml``, installed editable by ``make dev``); the Dockerfile
copies ``runner/`` and ``operator/`` only, and import-linter keeps the runtime and the operator from
importing it. Modules:

- ``launch``: the one launcher of the real operator process (``python -m agentrun_operator``) outside
  a Deployment: ``agentrun-dev``, ``make demo``, the cluster tests, ``bench/operator.py``, ``bench/chaos``;
- ``cluster``: ``agentrun-dev`` (``make cluster``), a local cluster to keep;
- ``servers``: private PostgreSQL, Redis and PgBouncer servers on free ports (tests and the chaos
  campaign stop and restart them), and ``free_port``;
- ``databases``: throwaway PostgreSQL databases on the server at ``AGENTRUN_TEST_POSTGRES_DSN``;
- ``kubeload``: what one client puts on the API server (a counting proxy), pods held Running without
  processes;
- ``graphs``: graphs the scale tests and the operator benchmark run (``agentrun_dev.graphs:ticker``).
"""
