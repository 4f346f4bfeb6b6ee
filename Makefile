# Two commands on a fresh machine: `make test` and `make demo`. Both set up .venv first.
# Kept to GNU make 3.81, macOS's make: no .ONESHELL, $(file ...), != or ::= assignments, grouped targets (&:) or
# undefine. Checked by reading, since this project's Linux machines have make 4.3; $(or ...) is 3.81's.
PYTHON ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# The Python that makes .venv (scripts/find_python.py, run by python3): .venv's own when it exists, else PYTHON,
# else the newest python3.11 or later on PATH, else python3 if it is 3.11 or later. Otherwise one line, no venv.
FIND_PYTHON = $(or $(shell command -v python3 2>/dev/null),$(PYTHON)) scripts/find_python.py --python "$(PYTHON)"
# The versions the suite passed with (constraints.txt; `make constraints` writes it from .venv)
PIP_INSTALL = $(PY) -m pip install --quiet -c constraints.txt

.PHONY: setup check-python constraints test demo blas clean-venv train-270m train-4b llamacpp-check

setup: $(STAMP) blas

check-python:
	@$(FIND_PYTHON) --venv $(VENV)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@python=`$(FIND_PYTHON) --venv $(VENV)` && \
	  { test -x $(PY) || { echo "$$python -m venv $(VENV)"; $$python -m venv $(VENV); }; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# The test extra (requirements-test.txt: hypothesis, and llama-cpp-python, which compiles llama.cpp without libcurl)
$(TEST_STAMP): $(STAMP) requirements-test.txt
	CMAKE_ARGS="$${CMAKE_ARGS:--DLLAMA_CURL=OFF}" $(PIP_INSTALL) -r requirements-test.txt
	touch $(TEST_STAMP)

constraints:
	$(PY) scripts/freeze_constraints.py > constraints.txt.new && mv constraints.txt.new constraints.txt

# Linux only: MLX's CPU wheel bundles the reference BLAS (~30x slower); Debian's OpenBLAS fixes that.
blas:
	@bash scripts/install_openblas.sh

test: setup $(TEST_STAMP)
	$(PY) scripts/run_tests.py

demo: setup
	bash scripts/demo.sh

# The real run: config/recipe.json's stages for the builtin 270M, from the base model to the ship stage
# (`wordle-mlx recipe`; its stage times are in docs/RESULTS.md). Resumable: run it again after an interruption.
# RECIPE_ARGS passes options on: make train-270m RECIPE_ARGS="--dry-run" (or "--until sft-fit", "--games 50").
RECIPE_ARGS ?=
train-270m: setup
	$(VENV)/bin/wordle-mlx recipe $(RECIPE_ARGS)

# The same recipe for Gemma 3 4B on a Mac (VARIANT=bf16 for 24 GB and more, VARIANT=4bit for 16 GB: the model
# mlx-community/gemma-3-4b-it-$(VARIANT)); resumable like train-270m.
VARIANT ?= bf16
train-4b: setup
	@case "$(VARIANT)" in bf16|4bit) ;; *) echo "VARIANT must be bf16 or 4bit, got '$(VARIANT)'" >&2; exit 2 ;; esac
	$(VENV)/bin/wordle-mlx recipe --model mlx-community/gemma-3-4b-it-$(VARIANT) $(RECIPE_ARGS)

# On demand: llama.cpp (llama-cpp-python from the test extra) vs wordle-mlx: 100 test boards, 100 games.
llamacpp-check: setup $(TEST_STAMP)
	$(PY) scripts/llamacpp_check.py

clean-venv:
	rm -rf $(VENV)
