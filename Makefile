# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
#
# `make test` runs the suite twice, once per supported megatron-core line, both at the same time:
#   1. $(VENV) (default .venv) on $(PYTHON) (default python3, 3.11 here): megatron-core 0.16.1;
#   2. $(VENV312) (default .venv-py312) on a Python 3.12, when one is found: the newest megatron-core 0.19.x
#      (0.19 needs Python >= 3.12). PYTHON312 names it; otherwise `python3.12` if it runs, else pyenv's newest
#      installed 3.12 (`PYENV_VERSION=3.12.x pyenv which python3.12`, pyenv's shim alone fails without it).
# `make demo PYTHON=/path/to/python3.12 VENV=.venv-py312` (or `make test-one ...`) uses one venv of your choice.
PYTHON ?= python3
VENV   ?= .venv
VENV312 ?= .venv-py312
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pai-zoo-installed
PLUGINS := $(wildcard plugins/pai-zoo-*)
PYTEST_ARGS ?=

.PHONY: demo test test-one setup clean

# A Python 3.12 for the megatron-core 0.19 pass, or nothing.
find_python312 = $(or $(PYTHON312),$(shell \
	if python3.12 -c "" >/dev/null 2>&1; then command -v python3.12; \
	elif command -v pyenv >/dev/null 2>&1; then \
	  v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$$' | sort -t. -k3 -n | tail -n 1); \
	  [ -n "$$v" ] && PYENV_VERSION=$$v pyenv which python3.12 2>/dev/null; fi))

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to 2.13.0 (on Python 3.11 the registry's CPU build; an unpinned torch would pull a
# multi-GB CUDA build), then megatron-core (pyproject: >=0.16.1,<0.20, so 0.16.1 on 3.11, the newest 0.19.x
# on 3.12), transformers and the rest through the packages' own dependencies, then the core, the
# conformance suite and every plugin, editable. The editable projects (and the few dependencies published as
# sources) build with the venv's own setuptools (--no-build-isolation): every pyproject here asks for setuptools
# alone, and pip's isolation would make a fresh build environment, setuptools installed, for each of the 26 projects.
$(STAMP): $(PY) pyproject.toml conformance/pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	$(PY) -m pip install -q --upgrade pip "setuptools>=70.1"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-build-isolation -e ".[test]" -e conformance $(foreach p,$(PLUGINS),-e "$(p)[test]")
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m pai_zoo.cli.demo

# Lint (ruff, configured in pyproject.toml), then the suite, in one venv ($(VENV) on $(PYTHON)), on one torch thread
# per process (OMP_NUM_THREADS=1: the floats do not depend on the machine's cores). The tests marked no_megatron
# (they never import megatron-core, which --pai-zoo-megatron-free checks by forbidding it) run first, then the rest;
# MEGATRON_ONLY=1 runs the rest alone: the second megatron-core version's pass. pytest's last lines say where the
# time went: the forty slowest tests, then the total.
MEGATRON_ONLY ?=
# ONCE_PASS=first|second: this is one of two megatron-core passes; it runs only its share of the tests marked
# megatron_once (first: those marked megatron_once(first=True); second: the others). Empty: all of them.
ONCE_PASS ?=
test-one: $(STAMP)
	$(PY) -m ruff check .
	@export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; rc=0; \
	$(if $(MEGATRON_ONLY),,echo "== the tests that never import megatron-core (once) =="; \
	  $(PY) -m pytest -q --durations=40 --pai-zoo-megatron-free $(PYTEST_ARGS) || rc=1;) \
	echo "== the tests of megatron-core $$($(PY) -c 'import importlib.metadata as m; print(m.version("megatron-core"))') =="; \
	$(PY) -m pytest -q --durations=40 --pai-zoo-megatron-only $(if $(ONCE_PASS),--pai-zoo-once-pass=$(ONCE_PASS)) \
	  $(PYTEST_ARGS) || rc=1; \
	exit $$rc

# The two passes run at the same time (the 0.19 pass's output is printed when it ends): on 2 cores that takes
# about as long as the slower pass alone, where one after the other took the sum. The tests that never import
# megatron-core run in the first pass only; those marked megatron_once (no particular megatron-core version) in one
# of the two, split to balance them: megatron_once(first=True) in the first, the others in the 0.19 pass.
test:
	@py312="$(call find_python312)"; \
	if [ -z "$$py312" ]; then \
	  echo "make test: no Python 3.12 found (set PYTHON312=...): the megatron-core 0.19 pass did not run"; \
	  $(MAKE) --no-print-directory test-one; exit $$?; \
	fi; \
	log=$$(mktemp); \
	echo "make test: megatron-core 0.19 pass on $$py312 in $(VENV312), alongside the first (output at the end)"; \
	$(MAKE) --no-print-directory test-one PYTHON="$$py312" VENV=$(VENV312) MEGATRON_ONLY=1 ONCE_PASS=second >"$$log" 2>&1 & pid=$$!; \
	$(MAKE) --no-print-directory test-one ONCE_PASS=first; rc1=$$?; \
	wait $$pid; rc2=$$?; \
	echo "== make test: the megatron-core 0.19 pass ($(VENV312)) =="; cat "$$log"; rm -f "$$log"; \
	echo "make test: first pass exit $$rc1, megatron-core 0.19 pass exit $$rc2"; \
	[ $$rc1 -eq 0 ] && [ $$rc2 -eq 0 ]

clean:
	rm -rf $(VENV) $(VENV312)
