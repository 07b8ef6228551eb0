# Daydream's front door. `make test` creates .venv, installs the project and runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two installs into one .venv: what a prediction needs (`pip install -e .`, for make predict,
# ingest and accuracy), and the test extras on top of it (make test, lint, bench).
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed
# The kernels of ingest, graphstore and the simulator compiled ahead of time (base/compiled.py; the modules
# that declare them are named once, in daydream/warmup.py): rebuilt when a source of those
# stages changes; without a C compiler the stamp says so and numba compiles them on first use
KERNELS := base/_kernels.stamp
KERNEL_SOURCES := $(wildcard base/*.py ingest/*.py graphstore/*.py simulate/*.py) daydream/warmup.py
STORE ?= .daydream
TRACE ?= tests/data/kineto/resnet50_v100_nw0_run1.json.gz
OPT ?= amp

.PHONY: venv test lint bench accuracy ingest predict clean

$(CORE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m daydream.warmup
	touch $(CORE)

$(STAMP): $(CORE)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(KERNELS): $(CORE) $(KERNEL_SOURCES)
	$(PY) -m daydream.warmup --ahead-of-time

venv: $(STAMP) $(KERNELS)

test: $(STAMP) $(KERNELS)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Ingest a trace (or folder, or glob) into the store: make ingest TRACE=path STORE=dir
ingest: $(CORE) $(KERNELS)
	$(VENV)/bin/daydream ingest $(TRACE) --store $(STORE)

# What-if prediction on a trace: make predict TRACE=path OPT=spec (defaults: a small real
# trace shipped in the repo, and mixed precision)
predict: $(CORE) $(KERNELS)
	$(VENV)/bin/daydream predict $(TRACE) --store $(STORE) --opt '$(OPT)'

# The accuracy harness (bench/accuracy/: the judge's scorecard, ../shared/judge/score.py run
# against .venv/bin/daydream, first; then one module per measure of ACCURACY.md, on the judged
# traces of bench/manifest.py), written to docs/accuracy.md and docs/accuracy.json;
# make accuracy ONLY=response reruns one section
accuracy: $(STAMP) $(KERNELS)
	$(PY) -m bench.accuracy $(if $(ONLY),--only $(ONLY))

# Benchmarks (not tests): time Daydream and the peer tool side by side, write docs/benchmarks.md
bench: $(STAMP) $(KERNELS)
	bash bench/hta_env.sh
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .venv-hta .daydream .pytest_cache .ruff_cache
	rm -f base/_kernels*.so $(KERNELS)
