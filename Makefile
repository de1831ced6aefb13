# Everything starts from a fresh machine: `make run` and `make test` create the virtualenv themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# The decision core compiled with mypyc: the modules are COMPILED_MODULES in setup.py (listed there
# only); pure Python when compiling fails.
COMPILED_SOURCES := setup.py $(shell sed -n 's/^ *"\(webhook\/[a-z_/]*\.py\)",$$/\1/p' setup.py)
COMPILED := $(VENV)/.compiled-stamp
REMOVE_COMPILED := rm -f webhook/*.so webhook/*/*.so *__mypyc*.so
HOST   ?= 127.0.0.1
PORT   ?= 8443

.PHONY: all setup compile pure run test e2e-minors lint typecheck unit promtool bench bench-audit bench-instructions bench-apiserver bench-lending bench-lending-recommend bench-scale bench-view fuzz soak certs manifests clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# Compiled in place (webhook/core/*.so next to the sources, git-ignored). Rebuilt whenever a compiled source
# changes; tests/conftest.py refuses to run against a compiled module older than its source.
define compile_core
	$(REMOVE_COMPILED)
	ROCM_ISOLATION_COMPILE=1 $(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation \
	    --no-deps -e . || { $(REMOVE_COMPILED); echo "mypyc compilation failed: running pure Python"; }
	touch $(COMPILED)
endef

$(COMPILED): $(STAMP) $(COMPILED_SOURCES)
	$(compile_core)

setup: $(COMPILED)

compile: $(STAMP)
	$(compile_core)

# Back to the pure Python reference (until a compiled source changes or `make compile`).
pure: $(STAMP)
	$(REMOVE_COMPILED)
	touch $(COMPILED)

certs/tls.crt: | $(COMPILED)
	$(PY) -m webhook certs --out-dir certs

certs: certs/tls.crt

run: $(COMPILED) certs/tls.crt
	$(PY) -m webhook serve --cert-dir certs --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(PY) -m ruff check webhook tests
	$(PY) -m ruff format --check webhook tests
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(COMPILED)
	@command -v promtool >/dev/null 2>&1 || echo "NOTE: promtool not found: the alert rule tests of" \
	    "tests/deploy/test_monitoring.py are skipped. \`make promtool\` installs it (Debian package prometheus)."
	$(PY) -m pytest

# promtool (Debian's prometheus package) checks and unit-tests the alert rules of the monitoring pack; the
# package's prometheus server runs `pool recommend`'s e2e test (tests/e2e/test_e2e_recommend.py).
# Installed with apt when missing and running as root (CI); otherwise says what to do.
promtool:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	        prometheus >/dev/null || echo "NOTE: apt-get could not install prometheus: the alert rule tests are skipped"; \
	else \
	    echo "NOTE: promtool/prometheus missing: run \`sudo apt-get install prometheus\` (the alert rule tests and" \
	        "pool recommend's e2e test are skipped)"; \
	fi

test: promtool lint typecheck unit

# The end-to-end tests of what a stock cluster of each older minor serves (issue 47; those marked minors(...)), on the
# v1.36 control plane emulating it (--emulated-version), then 1.35 with the MutatingAdmissionPolicy opt-in. `make test`
# runs the whole suite on 1.36; .ci/run runs both. Needs KUBEBUILDER_ASSETS (else the suite says it did not run).
E2E_MINORS ?= 1.33 1.34 1.35
E2E_MAP_OPT_IN_TESTS := tests/e2e/test_e2e_minors.py tests/e2e/test_e2e_backstop.py tests/e2e/test_e2e_map_v1beta1.py \
    tests/e2e/test_e2e_engine_fixtures.py
e2e-minors: $(COMPILED)
	@for minor in $(E2E_MINORS); do \
	    echo "== the end-to-end suite on Kubernetes $$minor"; \
	    E2E_KUBE_MINOR=$$minor $(PY) -m pytest tests/e2e -q || exit 1; \
	done
	@echo "== the end-to-end suite on Kubernetes 1.35 with the MutatingAdmissionPolicy opt-in"
	E2E_KUBE_MINOR=1.35 E2E_MAP_OPT_IN=1 $(PY) -m pytest $(E2E_MAP_OPT_IN_TESTS) -q

bench: $(COMPILED)
	$(PY) -m pytest tests/bench --benchmark-only -q
	$(PY) -m bench.run

# audit on 5,000 nodes and 150,000 pods (fake API): writes the "Audit at scale" section of docs/benchmarks.md
bench-audit: $(COMPILED)
	$(PY) -m bench.audit_scale

# the lending keeper's watched view per GPU pod it keeps: bytes, and a round's reads (in memory; issue 41)
bench-view: $(COMPILED)
	$(PY) -m bench.view_footprint

# instructions per decide() call, counted by callgrind (needs valgrind): repeatable on a busy machine
bench-instructions: $(COMPILED)
	$(PY) -m bench.instructions

# what the admission policies cost the apiserver per pod (its own histograms), in one run of alternating
# rounds: the placement MAP and the backstop VAPs against none, a floor policy and the pre-issue-27 baseline
# (bench/apiserver_baseline.yaml); docs/benchmarks.md. Needs KUBEBUILDER_ASSETS=.cache/envtest/bin (v1.36 binaries).
bench-apiserver: $(COMPILED)
	$(PY) -m bench.apiserver_admission

# The benchmarks on the real control plane find it as the e2e suite does: KUBEBUILDER_ASSETS, else .cache/envtest/bin
# (unpacked from ../shared/envtest when the archive is there); their plots need the `bench` extra. ARGS: more options.
ENVTEST_ARCHIVE ?= ../shared/envtest/kubernetes-v1.36.2-linux-amd64.tar.xz
define on_envtest
	@$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	@assets="$${KUBEBUILDER_ASSETS:-$(CURDIR)/.cache/envtest/bin}"; \
	if [ ! -x "$$assets/kube-apiserver" ] && [ -z "$$KUBEBUILDER_ASSETS" ] && [ -f "$(ENVTEST_ARCHIVE)" ]; then \
	    mkdir -p .cache/envtest && xz -dc "$(ENVTEST_ARCHIVE)" | tar -x -C .cache/envtest; \
	fi; \
	KUBEBUILDER_ASSETS="$$assets" $(PY) -m $(1) $(ARGS)
endef

# what lending recovers, trace-driven on the real control plane (issue 37): strict reservation, then lending, on
# one daily trace (about 15 minutes on 2 cores); writes its section of docs/benchmarks.md and docs/bench-lending.png,
# the figures as JSON on the last line.
bench-lending: $(COMPILED)
	$(call on_envtest,bench.lending)

# what the lending keeper of `serve` costs the apiserver and itself as the cluster grows (issue 41), on the real
# control plane: 50 nodes / 1,000 pods up to 1,000 nodes / 30,000 pods, a steady window per size, one reclaim at the
# largest, extrapolated to 5,000 / 150,000 (about 15 minutes on 2 cores); writes its section of docs/benchmarks.md
# and docs/bench-scale.png, the figures as JSON on the last line. ARGS: more options of bench.scale (--sizes,
# --window-seconds, --label, --save-before, --no-write).
bench-scale: $(COMPILED)
	$(call on_envtest,bench.scale)

# the same trace at the size `pool recommend` gives, beside the hand-chosen one (issue 43): lending at 2 devices per
# split node recording the webhook's demand gauges, `pool recommend --from-file` on them, lending again at what it
# said (about 15 minutes on 2 cores); writes its section of docs/benchmarks.md, the figures as JSON on the last line.
bench-lending-recommend: $(COMPILED)
	$(call on_envtest,bench.lending_recommend)

# 5,000 examples per test can take longer than the suite's 300 s hang timeout on a busy machine.
fuzz: $(COMPILED)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest tests -k fuzz -q --timeout 3600

soak: $(COMPILED)
	$(PY) -m bench.soak

manifests: $(STAMP)
	$(PY) -m webhook manifests

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .hypothesis
	$(REMOVE_COMPILED)
