# agentrun developer commands. Everything installs into ./.venv from pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: bytecode k8s image node node-packages cluster dashboard prometheus chromium pgbouncer bench chaos dev test test-unit test-integration test-postgres test-cluster test-badinput test-chart lint demo demo-local e2e-kind deploy-manifests lock clean

$(STAMP): pyproject.toml kubesim/pyproject.toml devtools/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./kubesim -e ./devtools -e '.[dev,bench]'
	touch $(STAMP)

dev: $(STAMP)  ## create .venv with the project and its test/lint tools

bytecode: $(STAMP)  ## compile every module once: with PYTHONDONTWRITEBYTECODE set (this machine, the image) no process writes .pyc, so each runner process would compile agentrun from source (~200 ms of CPU per start)
	$(BIN)/python -m compileall -q -j 0 runner operator kubesim/src devtools bench examples tests hack >/dev/null

test: $(STAMP) bytecode prometheus chromium pgbouncer k8s image node-packages  ## every tier (the real control plane's binaries and the images built or reused first; PostgreSQL and Redis on 127.0.0.1 installed and started when down); tests/cluster beside the rest (hack/test_tiers.sh)
	bash scripts/services.sh
	bash hack/test_tiers.sh

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

test-postgres: $(STAMP) pgbouncer
	$(BIN)/pytest -q tests/postgres

test-cluster: $(STAMP) bytecode prometheus chromium pgbouncer k8s  ## the emulated cluster and the real control plane (kubesim's self-tests incl. test_real.py, then agentrun's cluster tier)
	$(BIN)/pytest -q kubesim/tests tests/cluster

test-badinput: $(STAMP)  ## bad input (issue 13): fuzzed specs and tool arguments, damaged ledger rows, 10 MB results, secrets; needs PostgreSQL
	$(BIN)/pytest -q tests/badinput

test-chart: $(STAMP)  ## the Helm chart (real Helm), deploy/ and the Dockerfile, without a cluster
	$(BIN)/pytest -q tests/chart tests/e2e/test_manifests.py

bench: $(STAMP) bytecode pgbouncer  ## what durability costs: agentrun vs LangGraph vs the PostgreSQL commit floor; then what the operator costs the cluster, then connections and step latency at 300 concurrent runs direct vs through PgBouncer (bench/REPORT.md; BENCH_ARGS=--baseline REV, OPERATOR_BENCH_ARGS=--baseline REV, PGBOUNCER_BENCH_ARGS=--runs N); then runner pods on the real node beside the process kubelet (NODE_BENCH_ARGS=--pods N --kills N --burst N)
	bash scripts/services.sh
	$(BIN)/python -m bench.runtime $(BENCH_ARGS)
	$(BIN)/python -m bench.runtime profile
	$(BIN)/python -m bench.langgraph_saver
	$(BIN)/python -m bench.operator $(OPERATOR_BENCH_ARGS)
	$(BIN)/python -m bench.pgbouncer $(PGBOUNCER_BENCH_ARGS)
	$(BIN)/python -m bench.node $(NODE_BENCH_ARGS)

chaos: $(STAMP)  ## the seeded fault campaign: 220 trials, every fault kind, figures in bench/results/reliability.json and bench/RELIABILITY.md (CHAOS_ARGS: --trials N --first-seed S --concurrency C; replay: python -m bench.chaos replay SEED)
	bash scripts/services.sh
	$(BIN)/python -m bench.chaos run $(CHAOS_ARGS)

lint: $(STAMP)  ## ruff (lint and format), mypy --strict (product, kubesim and test support code), import layers, no import cycle, no unexplained function over 80 lines, every error code from errors.py only, no test module imported by another
	$(BIN)/ruff check runner operator kubesim devtools tests examples bench
	$(BIN)/ruff format --check runner operator kubesim devtools tests examples bench
	# mypy's cache outside the checkout, as the k8s binaries and images are: a clean checkout (CI) re-checks only what
	# changed (mypy compares each file's hash) instead of ~50 s of CPU from nothing
	MYPY_CACHE_DIR=$${MYPY_CACHE_DIR:-$$HOME/.cache/agentrun/mypy} $(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python hack/import_cycles.py
	$(BIN)/python hack/long_functions.py
	$(BIN)/python hack/error_codes.py
	$(BIN)/python hack/test_imports.py

demo: $(STAMP)  ## emulated cluster: kubectl apply, SIGKILL the runner mid-tool, rescheduled, charged once
	bash scripts/services.sh
	$(BIN)/python examples/cluster_demo.py

# AGENTRUN_DEV_K8S=node needs the node's binaries, images and packages; the other modes do not build them.
# The default store is the local PostgreSQL (the history reads PostgreSQL only): started as make demo starts it,
# unless another store is named; when that fails (no root for apt?) agentrun-dev falls back to SQLite and says so.
cluster: $(STAMP) $(if $(filter node,$(AGENTRUN_DEV_K8S)),k8s image node-packages)  ## a local cluster to keep: kubesim's API server on 127.0.0.1:6880 (AGENTRUN_DEV_PORT), the operator, runner pods as local processes (your PYTHONPATH), the history server, the store in database agentrun_dev of the local PostgreSQL (scripts/services.sh; AGENTRUN_DEV_POSTGRES_DSN for yours, AGENTRUN_DEV_STORE=sqlite for a file, no history); AGENTRUN_DEV_K8S=real: the real control plane; AGENTRUN_DEV_K8S=node (root): the real control plane and node with the chart installed, runner pods in containers, PostgreSQL on the node's address; Ctrl-C stops it
	$(if $(filter node,$(AGENTRUN_DEV_K8S))$(AGENTRUN_DEV_POSTGRES_DSN)$(filter sqlite,$(AGENTRUN_DEV_STORE)),,bash scripts/services.sh || echo "make cluster: scripts/services.sh failed (above): agentrun-dev uses SQLite if no PostgreSQL answers")
	$(BIN)/agentrun-dev

demo-local: $(STAMP)  ## no cluster, no services: the support agent on SQLite, SIGKILL mid-tool, resume
	$(BIN)/python examples/crash_resume_demo.py

e2e-kind: $(STAMP)  ## real cluster: kind, the image, helm install of the chart with its dev store, the operator scenarios (docker, kind, kubectl, helm; KEEP_CLUSTER=1 keeps it)
	bash hack/e2e-kind.sh

dashboard: $(STAMP)  ## helm/agentrun/dashboards/agentrun.json from hack/dashboard.py (grafana-foundation-sdk); tests/chart fails when stale
	$(BIN)/python hack/dashboard.py

k8s:  ## the real control plane: kube-apiserver, kube-controller-manager (k8s.io/kubernetes) and etcd built from the Go module proxy at hack/k8s/versions.env's pins into ~/.cache/agentrun/k8s (AGENTRUN_K8S_CACHE); cold about 20 min on 2 cores, then instant (hack/k8s/README.md)
	bash hack/k8s/build.sh

image: $(STAMP)  ## the images, built here with Debian's podman from the Dockerfile: localhost/agentrun:dev (runtime), localhost/agentrun-demo:dev (demo) and localhost/agentrun-pause:dev (the node's pod sandbox), also as OCI archives in ~/.cache/agentrun/image (AGENTRUN_IMAGE_CACHE); base from Debian's packages, wheels checked against the lock's hashes, no network in the build; cold about 4 min on 2 cores (9 beside a Go build), then instant while its inputs are unchanged (hack/image/build.sh)
	bash hack/image/build.sh

node: $(STAMP) k8s image node-packages  ## a real node joined to the real control plane, kept until Ctrl-C (kubesim.node): containerd and runc (Debian's), CNI bridge, kubelet, kube-proxy, kube-scheduler, the images imported; pods reach only their subnet, Service IPs and the host address the API server listens on; root; about 25 s to Ready, Ctrl-C removes pods, mounts, namespaces, cgroups and processes (python -m kubesim.node sweep after a crash)
	$(BIN)/python -m kubesim.node

node-packages:  ## Debian's containerd, runc, containernetworking-plugins and nftables for the real node (installed without starting their services)
	bash scripts/node_packages.sh

prometheus:  ## Debian's prometheus binary for the metrics test (tests start it themselves; never as a service)
	bash scripts/prometheus.sh

pgbouncer:  ## Debian's pgbouncer for the PgBouncer tests and bench (they start their own process; never as a service)
	bash scripts/pgbouncer.sh

chromium:  ## Debian's chromium for the history web view's browser test (Playwright drives it; never downloaded)
	bash scripts/chromium.sh

deploy-manifests: $(STAMP)  ## deploy/*.yaml from the Helm chart (real Helm); tests/chart fails when they drift
	$(BIN)/python hack/render_manifests.py

lock: $(STAMP)  ## requirements/*.txt: the image's dependencies pinned with hashes, from pyproject.toml (LOCK_ARGS=--upgrade bumps)
	bash hack/lock.sh $(LOCK_ARGS)

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
