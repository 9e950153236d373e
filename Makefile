# Every target creates .venv and installs the project on first use.
VENV ?= .venv
PYTHON ?= $(shell command -v python3.11 || command -v python3)
STAMP := $(VENV)/.installed-$(shell md5sum pyproject.toml | cut -c1-12)
# uv installs the packages pyproject.toml pins from PyPI, as pip would, in a third of the time:
# it downloads in parallel and links the files from its cache (~/.cache/uv, shared by every
# project): 44 s instead of 2 min 10 s for the first install on the 2-core machine. A package
# mirror is uv's to know: UV_INDEX_URL (it does not read pip.conf).
UV_VERSION := 0.13.9
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo serve-demo test test-long test-fast lint bench install clean-demo gpu-check gpu-bench gpu-wheels docs docs-build

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 needed, found {sys.version.split()[0]} at {sys.executable}"'
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --python $(VENV)/bin/python -e '.[dev,deploy,docs]'
	@rm -f $(VENV)/.installed-* && touch $@

## Build the demo corpus, train a small Conformer-Transducer, decode, print WER.
demo: $(STAMP)
	bash recipes/demo/run.sh

## Serve the demo's streaming model at http://127.0.0.1:8000/ (docs/serving.md); trains it first if missing.
serve-demo: $(STAMP)
	test -f exp/demo_streaming/model.bundle.pt || EXPERIMENT=demo_streaming bash recipes/demo/run.sh
	asr-serve exp/demo_streaming/model.bundle.pt \
	  --example "$$(find data/demo/LibriSpeech/test-clean -name '*.flac' | sort | sed -n 1p)"

## The test suite (slow tests included: about 10 minutes), all but the `long` tests.
test: $(STAMP)
	pytest -q -n 2 -m "not long" --durations=15

## The `long` tests: whole recipes, the GPU check's rehearsal, processes killed and resumed.
test-long: $(STAMP)
	pytest -q -n 2 -m long --durations=15

test-fast: $(STAMP)
	pytest -q -n 2 -m "not slow" --durations=15

## Transducer-loss benchmark: time and peak memory, one JSON line per case (a few minutes).
bench: $(STAMP)
	pip install --quiet -e ".[dev,bench]"
	python scripts/benchmark_transducer_loss.py --cases a,b

## On a GPU machine: the code paths only a GPU runs, in at most 7 minutes (docs/gpu.md).
gpu-check: $(STAMP)
	python scripts/gpu_check.py

## On a GPU machine: the papers' headline claims measured at their scale, in at most 9 minutes.
gpu-bench: $(STAMP)
	python scripts/gpu_bench.py

## Wheels for the GPU check and bench on a machine that reaches no registry (docs/gpu.md): .gpu-wheels/
gpu-wheels:
	bash scripts/prepare_gpu_wheels.sh .gpu-wheels

## The documentation site at http://127.0.0.1:8000, rebuilt as the pages change.
docs: $(STAMP)
	mkdocs serve

## Build the site into site/ with --strict: a broken link or reference fails (make test does it too).
docs-build: $(STAMP)
	mkdocs build --strict

lint: $(STAMP)
	ruff check asr tests scripts docs/hooks.py
	ruff format --check asr tests scripts docs/hooks.py

clean-demo:
	rm -rf data/demo exp/demo
