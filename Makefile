# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODEL_DIR ?= runs/quickstart
PYTEST_WORKERS ?= 2

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m t5x_like.train --gin_file=quickstart.gin --gin.MODEL_DIR="'$(MODEL_DIR)'"

# pytest exits 5 when it collected no tests: treat that as a failure, loudly.
test: $(STAMP)
	@$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache
