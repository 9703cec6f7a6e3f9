# smetric developer entry points. `make demo` runs the main job, `make test` every gate and test.
# Both set themselves up: a virtualenv in .venv with the extension built in release mode.

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONDONTWRITEBYTECODE := 1
PY_SOURCES := $(wildcard python tests benches scripts)

.PHONY: setup demo test lint lint-rust lint-python test-rust test-python bench clean

setup:
	bash scripts/bootstrap.sh "$(PYTHON)" "$(VENV)"

demo: setup
	$(VENV)/bin/smetric simulate --out results/default

lint-rust:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

lint-python: setup
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV)/bin/mypy --strict python/smetric
	$(PY) -m mypy.stubtest smetric._core --allowlist .mypy-stubtest-allowlist

lint: lint-rust lint-python

test-rust:
	cargo test --workspace --all-targets

test-python: setup
	$(PY) -m pytest

test: lint test-rust test-python

bench: setup
	cargo bench --workspace
	$(PY) -m pytest benches/python --benchmark-enable --benchmark-only

clean:
	rm -rf $(VENV) target
