# payauth — the commands a person (and CI) runs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PAYAUTH := $(VENV)/bin/payauth
BENCH_OUT ?= .bench/results.json
STAMP := $(VENV)/.installed

.PHONY: help venv stack-up stack-down stack-status test-tools migrate run demo test test-unit \
        test-deploy test-integration test-e2e check lint types bench soak chaos lock clean \
        ha-up ha-down ha-wipe ha-status ha-chaos ha-smoke image test-containers \
        secure-up secure-down secure-status secure-smoke k8s-api k8s-api-down

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.lock pyproject.toml
	@echo "[venv] creating $(VENV) and installing the pinned dependencies"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >/dev/null
	@$(PY) -m pip install -q --require-hashes -r requirements-dev.lock
	@# setuptools warns about every editable install; the warning is not for the reader
	@$(PY) -m pip install -q --no-deps -e . >$(VENV)/editable-install.log 2>&1 \
	  || { cat $(VENV)/editable-install.log; exit 1; }
	@touch $(STAMP)

venv: $(STAMP) ## create .venv with the locked dependencies

stack-up: venv ## start Kafka, PostgreSQL and Redis locally (no Docker), reuse what runs
	@PYTHON=$(PY) deploy/local/stack.sh up

stack-down: ## stop what stack-up started, and the API server make test starts (k8s-api)
	@deploy/local/stack.sh down
	@deploy/local/k8s-api.sh down

test-tools: ## install what the tests call besides the stack (promtool, valgrind; nft as root), if missing
	@deploy/local/stack.sh tools

stack-status: ## which stack services answer
	@deploy/local/stack.sh status

ha-up: venv ## the replicated stack: 3 Kafka nodes, pg_auto_failover, Redis Sentinel; writes .stack/ha.env
	@PYTHON=$(PY) deploy/local/ha.sh up

ha-down: ## stop what ha-up started
	@deploy/local/ha.sh down

ha-wipe: ## ha-down, and every node's data deleted: the next ha-up starts as on a new machine
	@deploy/local/ha.sh wipe

ha-chaos: ha-up ## the chaos run on the replicated stack: failovers of each engine (CHAOS_SECONDS, HA_CHAOS_KINDS)
	@$(PY) -m service.devtools.chaos.ha

ha-smoke: ha-up ## the HA smoke: one failover of each engine under load, then the checker's negative control
	@PAYAUTH_HA_SMOKE=1 $(PY) -m pytest -q tests/ha

ha-status: venv ## the PostgreSQL primary, the Redis master and each topic's partition leaders
	@PYTHON=$(PY) deploy/local/ha.sh status

secure-up: venv ## the secured stack: TLS everywhere, SCRAM/ACLs; writes .stack/secure.env and .stack/secure-admin.env
	@PYTHON=$(PY) deploy/local/secure.sh up

secure-down: ## stop what secure-up started (its data stays in .stack/secure/)
	@deploy/local/secure.sh down

secure-status: ## which secured stack services answer
	@deploy/local/secure.sh status

secure-smoke: secure-up ## the tier on the secured stack: refusals, least privilege, no secret in any log
	@PAYAUTH_SECURE_SMOKE=1 $(PY) -m pytest -q tests/secure

k8s-api: ## a real Kubernetes API server on 127.0.0.1 for the deploy tests (built once); writes .stack/k8s/kubeconfig
	@deploy/local/k8s-api.sh up

k8s-api-down: ## stop the API server and drop what it stored
	@deploy/local/k8s-api.sh down

migrate: venv ## apply the database migrations
	@$(PAYAUTH) migrate

run: venv ## one worker in the foreground (configure with PAYAUTH_* variables)
	@$(PAYAUTH) run

demo: stack-up migrate ## the main job end to end: two workers, duplicates, DLQ, summary, verify
	@PAYAUTH_LOG_LEVEL=WARNING $(PY) -m service.devtools demo

test: stack-up test-tools k8s-api ## every test tier (unit, deploy, integration, e2e, a short chaos run, containers)
	@PAYAUTH_K8S_API=required $(PY) -m pytest -q tests/unit tests/deploy tests/integration tests/e2e tests/chaos
	@$(MAKE) --no-print-directory test-containers

test-unit: venv ## unit tests only: pure logic, no I/O, no services, no tools
	@$(PY) -m pytest -q tests/unit

test-deploy: venv test-tools k8s-api ## the deployment artifacts: alert rules (promtool), k8s (on a real API server), compose, image
	@PAYAUTH_K8S_API=required $(PY) -m pytest -q tests/deploy

test-integration: stack-up ## integration tests (real Kafka, PostgreSQL, Redis)
	@$(PY) -m pytest -q tests/integration

image: venv ## build payauth:local (docker, else podman, installed if missing; offline: WHEELHOUSE=dir)
	@PYTHON=$(PY) deploy/image/build.sh

test-containers: stack-up image ## the image's containers: 3 workers in one group, stop/kill, probes, operator commands
	@$(PY) -m pytest -q tests/containers

test-e2e: stack-up ## end-to-end tests
	@$(PY) -m pytest -q tests/e2e

bench: stack-up ## benchmark report, ratios against baselines run alongside; JSON to $(BENCH_OUT)
	@BENCH_OUT=$(BENCH_OUT) $(PY) -m service.devtools.bench.run

soak: stack-up ## a steady load at half the drain rate, purged every minute: does anything grow? (SOAK_MINUTES, 30)
	@$(PY) -m service.devtools.bench.soak

chaos: stack-up migrate ## fault-injection run + invariant checker (CHAOS_SECONDS, CHAOS_SEED)
	@$(PY) -m service.devtools.chaos.run

check: lint types ## lint + types

lint: venv
	@$(VENV)/bin/ruff check service tests

types: venv
	@$(VENV)/bin/mypy

lock: ## re-pin the dependencies (needs uv): runtime for the image, runtime+dev for .venv
	uv pip compile pyproject.toml --generate-hashes --python-version 3.11 -o requirements.lock
	uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 -o requirements-dev.lock

clean: ## remove the virtualenv and caches (not the stack's data)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
