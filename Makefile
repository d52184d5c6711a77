# Two commands for a new user:
#   make run    set up .venv (first time) and run the ReFrame checks on the local profile
#   make test   run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hpckit-stack
PIP    := $(BIN)/pip install --quiet --disable-pip-version-check
CONSTRAINTS := -c requirements/constraints-cpu.txt

.PHONY: run test venv
run: $(STAMP)
	$(BIN)/reframe -C site_profiles/local/settings.py -c reframe_checks/ -r

test: $(STAMP)
	$(BIN)/python -m pytest tests

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/cpu.txt requirements/constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) $(CONSTRAINTS) -r requirements/cpu.txt
	$(PIP) $(CONSTRAINTS) --no-deps -e .
	touch $@
