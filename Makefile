# Two commands do all set-up on a fresh machine: `make serve` and `make test`.
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: serve test test-all install redis clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch is pinned first: an unpinned torch would pull the CUDA build.
$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[engine,dev,semantic,tune,redis]"
	touch $(STAMP)

install: $(STAMP)

# redis-server for the shared rate-limit test: installed when missing and we may (root + apt);
# otherwise that one test skips and says why.
redis:
	@command -v redis-server >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq redis-server >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq redis-server >/dev/null 2>&1)); } || true

serve: $(STAMP)
	$(VENV)/bin/tokenops serve $(ARGS)

test: $(STAMP) redis
	@$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

test-all: $(STAMP) redis
	$(PY) -m pytest -q -m "" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
