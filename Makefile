# Two commands on a fresh machine: `make test` and `make demo`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test demo blas clean-venv train-270m train-4b llamacpp-check

setup: $(STAMP) blas

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$${CMAKE_ARGS:--DLLAMA_CURL=OFF}" $(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Linux only: MLX's CPU wheel bundles the reference BLAS (~30x slower); Debian's OpenBLAS fixes that.
blas:
	@bash scripts/install_openblas.sh

test: setup
	$(PY) scripts/run_tests.py

demo: setup
	bash scripts/demo.sh

# The real run (2 h 15 min of training on a 2-core AVX-512 host, then about 45 min of evals; its stage times are
# in docs/RESULTS.md; resumable: run it again after an interruption).
train-270m: setup
	bash scripts/train_270m_cpu.sh

# Gemma 3 4B on a Mac (VARIANT=bf16 for 24 GB and more, VARIANT=4bit for 16 GB); resumable like train-270m.
train-4b: setup
	bash scripts/train_4b.sh

# On demand: llama.cpp (llama-cpp-python, from .venv or built in .venv-llamacpp) vs wordle-mlx: 100 test boards, 100 games.
llamacpp-check: setup
	$(PY) scripts/llamacpp_check.py

clean-venv:
	rm -rf $(VENV)
