# Both entry points create .venv from nothing when it is missing.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: this version is a local CPU wheel here; an unpinned torch would
	# pull gigabytes of CUDA packages. Without it the torch tests skip.
	$(PY) -m pip install -q torch==2.13.0 || echo "torch==2.13.0 not available: torch tests will skip"
	$(PY) -m pip install -q -e '.[dev]'
	# The bytecode an installed wheel has (pip compiles it): an editable install imports the
	# sources, and where PYTHONDONTWRITEBYTECODE is set nothing caches what each import
	# compiles (about 130 ms of `import regency.actor`, in every controller and zygote).
	# Not fatal: without it imports compile, as before.
	-$(PY) -m compileall -q regency
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/getting_started.py

lint: $(STAMP)
	$(VENV)/bin/ruff check regency tests benchmarks examples
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
	find regency benchmarks tests examples -name __pycache__ -type d -prune -exec rm -rf {} +
