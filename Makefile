# One-command set-up and run. `make demo` runs the main job on embedded defaults,
# `make test` runs the test suite; both create .venv on a fresh machine first.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: demo test venv clean corpus

venv: $(STAMP)

$(STAMP): pyproject.toml scripts/setup_venv.sh
	PY=$(PY) bash scripts/setup_venv.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh $(VENV)

test: $(STAMP)
	$(VPY) -m pytest -q tests

# Labeled diagnosis corpus (issue 9) from the HTA test traces in ../shared/data: corpus/ (git-ignored);
# score diagnose on it with `trainperf evaluate corpus`.
corpus: $(STAMP)
	$(VPY) benchmarks/build_corpus.py corpus

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info demo
