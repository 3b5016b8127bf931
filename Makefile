# Two entry points, each self-contained on a fresh machine:
#   make demo   -- a training loop local, then through a narrow link and a spoke: cold, warm, planned
#   make test   -- lint, type-check, import contracts and the full test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test lint venv tools clean locust soak bench simulate

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

venv: $(BIN)/.installed

# The demo needs the package and the lab's WAN driver only: no torch, pandas, locust.
# One line per step; pip says nothing unless something fails.
PIP_QUIET = --quiet --quiet --disable-pip-version-check --root-user-action=ignore
$(BIN)/.lab-installed: pyproject.toml
	@echo "== venv: $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@echo "== install: hubspoke and its lab extra (pip, quiet)"
	@$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	@$(BIN)/python -m pip install $(PIP_QUIET) -e '.[lab]'
	@touch $@

# System tools the tests drive: docker-compose (validates docker-compose.yml),
# nginx and wrk (the benchmark's smoke test), kubectl (renders deploy/k8s offline).
# Installed with apt when missing.
SYSTEM_TOOLS = docker-compose nginx wrk kubectl
tools:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: tools lint
	$(BIN)/python -m pytest -q

demo: $(BIN)/.lab-installed
	@$(BIN)/python -m loadtest.demo $(ARGS)

# Load tests and benchmarks (bounded in time, all on 127.0.0.1); reports go to reports/.
locust: venv
	$(BIN)/python -m loadtest.locust_run --users 20 --spawn-rate 10 --run-time 20s --out reports/locust $(ARGS)

soak: venv
	$(BIN)/python -m loadtest.soak --minutes 10 --out reports/soak $(ARGS)

# The S3 front end's rows (S3 against /objects of the same spoke) follow, in s3.md beside
# report.md; they take the run's --quick, not its other flags.
bench: venv
	$(BIN)/python -m loadtest.bench --out reports/bench $(ARGS)
	$(BIN)/python -m loadtest.bench_s3 --out reports/bench $(filter --quick,$(ARGS))

simulate: venv
	$(BIN)/python -m loadtest.simulate $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
