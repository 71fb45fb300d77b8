# `make run` and `make test` work on a fresh machine with only Python 3.11 and make:
# they create .venv if missing and install the project (editable) before running.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
CONFIG ?=

.PHONY: run test install bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Every process of a tree imports the project's modules: compiled once here, they are read from
# __pycache__ even where PYTHONDONTWRITEBYTECODE keeps Python from writing them itself (each tree
# start compiled ~110 modules from source again, about 0.15 s of CPU per process).
BYTECODE := $(PY) -m compileall -q -j 0 -x "bench/results/" agentos actors broker gateway storage bench tests

run: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/agent-os serve $(if $(CONFIG),--config $(CONFIG))

# The suite mostly waits on real process trees, so it runs on TEST_WORKERS pytest-xdist workers
# (TEST_WORKERS=0 runs it in this process, in order). Six on two cores: at four, its tests' waits
# (trees starting, kills, timers) left the CPUs idle 27% of the run, at six 12.5% (814 tests in
# 199 s at 4, 163 s at 6, 176 s at 8, in one half hour; bench/RECORD.md, sixty-sixth session).
TEST_WORKERS ?= 6

# pytest keeps the test modules it rewrote for their asserts only where bytecode may be written:
# collecting the suite took 4.7 s of CPU in each worker without them, 1.6 s with.
test: $(STAMP)
	$(BYTECODE)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

clean:
	rm -rf $(VENV) build *.egg-info
