# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODEL_DIR ?= runs/quickstart
PYTEST_WORKERS ?= 2

.PHONY: install demo test test-fast libtpu-venv test-libtpu clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m t5x_like.train --gin_file=quickstart.gin --gin.MODEL_DIR="'$(MODEL_DIR)'"

# The suite in three tiers (docs/testing.md): unit, integration, system. `make test` runs all of them (CI too);
# `make test-fast` the unit tier and a two-step pulse per family, for after each change.
# pytest exits 5 when it collected no tests: treat that as a failure, loudly.
# A worker that dies (a fatal signal in native code) is not replaced: pytest-xdist 3.8's loadfile scheduling can
# wait forever after replacing one (pytest-dev/pytest-xdist#1378); the run ends at once, naming the test instead.
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0
# The shell's `times` after pytest: its second line is the CPU time of every process the recipe started (user,
# system), the number the suite's budget counts (docs/testing.md), printed on every machine that runs it, CI's too.
NO_TESTS_IS_AN_ERROR := rc=$$?; echo "CPU time (user, system) of the shell, then of every process it started:"; times; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# BYTECODE: the project's modules compiled once, before the hundreds of processes the suite starts import them
# (where PYTHONDONTWRITEBYTECODE is set, as on these machines, each process would compile them again).
BYTECODE := $(PY) -m compileall -q -j 0 t5x_like models partitioning configs scripts tests > /dev/null

test: $(STAMP)
	@$(BYTECODE); $(PYTEST) --durations=15 tests; $(NO_TESTS_IS_AN_ERROR)

test-fast: $(STAMP)
	@$(BYTECODE); $(PYTEST) --durations=5 -m "unit or pulse" tests; $(NO_TESTS_IS_AN_ERROR)

# A second virtualenv with libtpu (jax[tpu]) for compiling against TPU topologies without chips:
#   JAX_PLATFORMS=cpu .venv-libtpu/bin/python -m t5x_like.compile --gin_file=... --topology=v5p:2x2x1
# Kept apart from .venv because with libtpu installed JAX probes for TPUs at start-up.
LIBTPU_VENV := .venv-libtpu
LIBTPU_STAMP := $(LIBTPU_VENV)/.installed-stamp

libtpu-venv: $(LIBTPU_STAMP)

$(LIBTPU_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(LIBTPU_VENV)
	echo '*' > $(LIBTPU_VENV)/.gitignore
	$(LIBTPU_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LIBTPU_VENV)/bin/python -m pip install --quiet -e '.[test,tpu]'
	touch $(LIBTPU_STAMP)

# The tests that compile for TPU topologies through libtpu (they skip, with the reason, under .venv).
test-libtpu: $(LIBTPU_STAMP)
	JAX_PLATFORMS=cpu $(LIBTPU_VENV)/bin/python -m pytest -q -rs tests/models/test_attention_tpu.py \
		tests/t5x_like/test_compile.py -k "tpu or slices"

clean:
	rm -rf $(VENV) $(LIBTPU_VENV) runs .pytest_cache
