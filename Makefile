# Two commands a newcomer needs: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that lies on this machine's disk; installing it first
# keeps pip from resolving a multi-GB CUDA build for the `real` extra.
TORCH_PIN ?= torch==2.13.0

.PHONY: run test bench figs clean

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

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python $(VENV)/.system-libs
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -e '.[dev,real]'
	touch $@ $(VENV)/.base-installed

run: $(VENV)/.base-installed
	$(BIN)/gyre sim

# The real-engine tier: a separate SGLang CPU virtualenv (shared/notes/cpu-stack.md)
# and the npm harnesses (Claude Code, Codex) the proxy's harness tests run.
.venv-sglang/.installed: tools/setup_sglang_cpu.sh tools/sglang_cpu_requirements.txt tools/sglang_cpu_constraints.txt
	PY=$(PY) bash tools/setup_sglang_cpu.sh .venv-sglang
	touch $@

.harness/.installed: tools/setup_harnesses.sh
	bash tools/setup_harnesses.sh .harness
	touch $@

test: $(VENV)/.dev-installed .venv-sglang/.installed .harness/.installed
	bash tools/isolated.sh $(BIN)/python -m pytest -q

figs: $(VENV)/.base-installed
	$(BIN)/gyre figs --out figs

bench: $(VENV)/.dev-installed
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info
