# Two commands do everything on a fresh machine:
#   make run    create the environment, migrate, start API + workers, quantize the sample model
#   make test   create the environment, then run lint, import contracts and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# The CPU build of torch on this machine's disk; GPU images install a CUDA build instead.
TORCH  ?= torch==2.13.0

.PHONY: venv run test lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[worker,dev]"
	touch $@

run: venv
	$(BIN)/python -m launcher $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf var test-artifacts .pytest_cache
