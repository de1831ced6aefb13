# Everything starts from a fresh machine: `make run` and `make test` create the virtualenv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8443

.PHONY: all setup run test lint typecheck unit bench fuzz soak certs manifests clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

certs/tls.crt: | $(STAMP)
	$(PY) -m webhook certs --out-dir certs

certs: certs/tls.crt

run: $(STAMP) certs/tls.crt
	$(PY) -m webhook serve --cert-dir certs --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(PY) -m ruff check webhook tests
	$(PY) -m ruff format --check webhook tests

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit

bench: $(STAMP)
	$(PY) -m pytest tests/bench --benchmark-only -q
	$(PY) -m bench.run

fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest tests -k fuzz -q

soak: $(STAMP)
	$(PY) -m bench.soak

manifests: $(STAMP)
	$(PY) -m webhook manifests

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .hypothesis
