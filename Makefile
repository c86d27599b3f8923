# Two commands do everything on a fresh machine:
#   make run    create the environment, migrate, start API + workers, quantize the sample model
#   make test   create the environment, then run lint, import contracts and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# The CPU build of torch on this machine's disk; GPU images install a CUDA build instead.
TORCH  ?= torch==2.13.0

.PHONY: venv run test lint clean frontend

venv: $(VENV)/.installed

# constraints.txt: the dependency versions the suite last passed with (see its header).
$(VENV)/.installed: pyproject.toml constraints.txt quantcore/observers/_binning.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -c constraints.txt -e ".[worker,dev]"
	touch $@

run: venv frontend
	$(BIN)/python -m launcher $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The dashboard (frontend/dist, served by the API at /): rebuilt when its sources change, or the
# API's OpenAPI document may have (the client is generated from it at build time: api/, jobs/).
FRONTEND_SRC = $(shell find frontend/src -type f ! -name schema.d.ts) \
	$(addprefix frontend/,index.html package.json package-lock.json tsconfig.json vite.config.ts)
OPENAPI_SRC  = $(shell find api jobs -name '*.py')

frontend: frontend/dist/index.html

# `npm install --no-save` = the locked versions, lock left untouched. Not `npm ci`: the registry
# mirror here serves only the linux-x64 builds of rollup/esbuild, so the lock cannot list the
# other platforms' optional binaries, and `npm ci` refuses such a lock ("Missing: ... from lock file").
frontend/node_modules/.installed: frontend/package.json frontend/package-lock.json
	@command -v npm >/dev/null || { echo "the dashboard needs Node.js >= 20.19 with npm (see README)"; exit 1; }
	cd frontend && npm install --no-save --no-audit --no-fund
	touch $@

frontend/dist/index.html: frontend/node_modules/.installed $(VENV)/.installed $(FRONTEND_SRC) $(OPENAPI_SRC)
	cd frontend && QUANT_PYTHON=$(abspath $(BIN))/python npm run build

# Two pytest workers, whole files each (module fixtures built once): much of the suite waits on
# worker processes, heartbeats and retries rather than on a core.
TEST_WORKERS ?= 2
test: lint frontend
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf var test-artifacts .pytest_cache frontend/dist
