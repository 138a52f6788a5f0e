# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pai-zoo-installed
PLUGINS := $(wildcard plugins/pai-zoo-*)

.PHONY: demo test setup clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU build these machines have (an unpinned torch pulls a
# multi-GB CUDA build), then megatron-core, transformers and the rest through the packages'
# own dependencies, then the core, the conformance suite and every plugin, editable.
$(STAMP): $(PY) pyproject.toml conformance/pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]" -e conformance $(foreach p,$(PLUGINS),-e "$(p)[test]")
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m pai_zoo.demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
