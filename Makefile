# Two commands a newcomer needs: `make run` and `make test`.
# `make check` is the fast tier a developer runs every few minutes.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that lies on this machine's disk; installing it first
# keeps pip from resolving a multi-GB CUDA build for the `real` extra.
TORCH_PIN ?= torch==2.13.0

.PHONY: run check test bench figs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.base-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# Mooncake's Transfer Engine needs the RDMA user-space libraries even on tcp.
$(VENV)/.system-libs: | $(BIN)/python
	@if ! ldconfig -p | grep -q 'libibverbs.so.1 '; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq libibverbs1 libnl-3-200 libnl-route-3-200; \
	  else echo "Mooncake needs libibverbs1 libnl-3-200 libnl-route-3-200: install them (apt-get) and rerun"; exit 1; fi; \
	fi
	touch $@

$(VENV)/.check-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.base-installed

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python $(VENV)/.system-libs
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -e '.[dev,real,cluster,wandb,timeline]'
	touch $@ $(VENV)/.base-installed $(VENV)/.check-installed

run: $(VENV)/.base-installed
	$(BIN)/gyre sim

# The real-engine tier: a separate SGLang CPU virtualenv (docs/cpu-stack.md)
# and the npm harnesses (Claude Code, Codex) the proxy's harness tests run.
.venv-sglang/.installed: tools/setup_sglang_cpu.sh tools/sglang_cpu_requirements.txt tools/sglang_cpu_constraints.txt
	PY=$(PY) bash tools/setup_sglang_cpu.sh .venv-sglang
	touch $@

.harness/.installed: tools/setup_harnesses.sh
	bash tools/setup_harnesses.sh .harness
	touch $@

# The fast tier: pure core, simulator, analysis and pure trajectory tests,
# small Hypothesis budget, no heavy stack (tests/conftest.py).
CHECK_DIRS := tests/core tests/sim tests/analysis tests/trajectory tests/proxy_parse tests/differential
# Lint and type check first (a few seconds; settings in pyproject.toml). FORMATTED
# lists the files kept in `ruff format` style so far.
LINT_DIRS := gyre sim real/runtime real/proxy real/store analysis paper_figs
FORMATTED := tests/core/test_doc_references.py
check: $(VENV)/.check-installed
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(FORMATTED)
	bash tools/typecheck.sh $(VENV)
	GYRE_TEST_TIER=check $(BIN)/python -m pytest -q -n 2 -m "not slow" -p no:cacheprovider $(CHECK_DIRS)

test: $(VENV)/.dev-installed .venv-sglang/.installed .harness/.installed
	bash tools/isolated.sh $(BIN)/python -m pytest -q --durations=15

figs: $(VENV)/.base-installed
	$(BIN)/gyre figs --out figs

bench: $(VENV)/.dev-installed
	$(BIN)/python -m bench

# Two bursts of a small-model version of configs/gpu_node_qwen.toml where CUDA is present
# (CHECKPOINT=folder for a small Qwen checkpoint); says "no GPU" and exits 0 elsewhere.
.PHONY: gpu-smoke
gpu-smoke:
	PY=$(BIN)/python bash tools/gpu_smoke.sh $(CHECKPOINT)

clean:
	rm -rf $(VENV) build *.egg-info
