# Two commands a newcomer needs: `make run` (the default study) and `make test`.
# Both create .venv if it is missing and install the pinned stack and the package into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CORES  ?= all

.PHONY: run test rehearsal figures ui lint dry-run clean lock

$(STAMP): envs/requirements.txt envs/requirements-dev.txt envs/constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r envs/requirements-dev.txt -c envs/constraints.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

## run: the default study end to end (data, base policies, PRMs, training grid, eval, reports)
run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

## test: the test suite (CPU, deterministic)
test: $(STAMP)
	$(BIN)/python -m pytest

## rehearsal: every code path of configs/qwen2.5.yaml at CPU scale, on offline stand-ins for
## the hub (tiny Qwen2 policies and a Qwen2.5-Math-PRM-layout PRM that `race stand-ins` writes)
REHEARSAL_HUB := results-rehearsal/hub
rehearsal: $(STAMP)
	test -f $(REHEARSAL_HUB)/stand_ins.json || $(BIN)/race stand-ins --out $(REHEARSAL_HUB)
	$(BIN)/snakemake --cores $(CORES) --configfile configs/rehearsal.yaml

## figures: regenerate reports/ from the existing results
figures: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) reports/report.md

## ui: the MLflow UI over a study's tracking DB (UI_CONFIG: another study's config), on
## 127.0.0.1 with one worker; open the URL it prints first: the experiment's runs table
UI_CONFIG ?= config.yaml
ui: $(STAMP)
	$(BIN)/race mlflow-ui --config $(UI_CONFIG)

## lint: ruff on the package, tests and benchmarks; snakemake --lint on the workflow
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/snakemake --lint

dry-run: $(STAMP)
	$(BIN)/snakemake -n

clean:
	rm -rf results results-rehearsal logs benchmarks .snakemake

## lock: resolve envs/requirements-dev.txt afresh in a scratch venv (from the indexes pip is
## configured with, as `make` installs from) and write the version of every package it
## installed to envs/constraints.txt (run after changing a pin)
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/pip install --quiet -r envs/requirements-dev.txt
	$(LOCK_VENV)/bin/pip freeze --all --exclude pip > $(LOCK_VENV)/freeze.txt
	$(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version(), platform.system(), platform.machine())' > $(LOCK_VENV)/platform.txt
	{ echo "# Every package the pinned stack installs, at the version \`make lock\` resolved (Python"; \
	  echo "# $$(cat $(LOCK_VENV)/platform.txt)):"; \
	  echo "# \`make\` installs envs/requirements-dev.txt under these constraints, so a fresh machine gets"; \
	  echo "# the transitive dependencies too, not only the top-level pins. Local version labels"; \
	  echo "# (torch's +cpu) are dropped: ==2.13.0 admits the CPU and the CUDA build alike."; \
	  sed -E 's/\+[A-Za-z0-9.]+$$//' $(LOCK_VENV)/freeze.txt; } > $(LOCK_VENV)/constraints.txt
	mv $(LOCK_VENV)/constraints.txt envs/constraints.txt
	rm -rf $(LOCK_VENV)
