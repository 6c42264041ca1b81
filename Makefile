# make demo | make test | make bench — each sets up .venv by itself and is quick the second time.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvjudge-installed

# llama-cpp-python builds from source. A -march=native build crashed with "Illegal instruction" on
# some hosts, so build portable unless the user chose their own flags (e.g. -DGGML_CUDA=on on a GPU host).
PORTABLE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF
# Your own CMAKE_ARGS must really rebuild llama-cpp-python: pip would otherwise reuse a cached CPU wheel.
ifeq ($(origin CMAKE_ARGS),undefined)
PIP_CACHE :=
else
PIP_CACHE := --no-cache-dir
endif
CMAKE_ARGS ?= $(PORTABLE_CMAKE_ARGS)
export CMAKE_ARGS

.PHONY: demo test bench setup models bytecode clean gpu-bundle

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setting up $(VENV) (the first time builds llama-cpp-python: ~5 min on 2 cores)"
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@# setuptools warns at length about editable installs; nothing in it is actionable here.
	PYTHONWARNINGS=ignore $(PY) -m pip install -q --disable-pip-version-check $(PIP_CACHE) -e '.[local,test]'
	$(PY) -m kvjudge models fetch
	@touch $(STAMP)

models: $(STAMP)
	$(PY) -m kvjudge models fetch

# kvjudge's bytecode, compiled ahead: a Python run with PYTHONDONTWRITEBYTECODE set (as some CI images do) would
# otherwise compile every module again in each `python -m kvjudge` it starts (0.1-0.3 s each; the tests start hundreds).
bytecode: $(STAMP)
	@$(PY) -m compileall -q kvjudge

demo: bytecode
	$(PY) -m kvjudge demo

# The report's tests drive a real Chromium, the store's PostgreSQL tests a real server: the system's, installed
# from its packages when missing.
# Two pytest-xdist workers, a test file each at a time (a file's module fixtures, its model loads and servers, are
# built once): on the 2-core CI machine the suite waits on single-threaded child processes much of the time.
# TEST_WORKERS=auto uses every core; TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: bytecode
	scripts/ensure-chromium
	scripts/ensure-postgres
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	@mkdir -p bench-out
	@for script in benchmarks/*.py; do \
		echo "== $$script"; \
		$(PY) $$script --out bench-out || exit 1; \
	done

# What scripts/gpu-check needs on a GPU machine with no network (issue 47): llama-cpp-python's trimmed source and
# kvjudge's dependency wheels, at most 60 MiB, into gpu-bundle/ (gitignored; a device call carries it).
gpu-bundle: $(STAMP)
	$(PY) scripts/gpu_bundle.py --out gpu-bundle

clean:
	rm -rf $(VENV) bench-out .pytest_cache
