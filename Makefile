# Two commands do everything on a fresh clone: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
DEMO_DIR ?= runs/demo

.PHONY: venv browser demo test lint format clean gpu-venv gpu-test gpu-check

# torch is installed first and pinned, so pip never resolves a (multi-GB) CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) demo.py --out $(DEMO_DIR)

# The playground tests drive Debian's chromium + chromium-driver (installed here when root, as in CI).
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		if [ "$$(id -u)" != 0 ]; then \
			echo "make: chromium and chromium-driver are missing: sudo apt-get install chromium chromium-driver" >&2; \
			exit 1; \
		fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

test: venv browser
	$(PY) -m pytest tests

# Quality gates (CI runs them before the tests): formatting, lint, types, import layering.
lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# ---- NVIDIA machines ------------------------------------------------------------------------------
# A separate venv with onnxruntime-gpu only (never the CPU wheel, which would shadow its providers).
# On a GPU machine `pip install torch==...` is the CUDA build, which the exporter may use; serving
# (onnx GPU providers, TensorRT) does not need torch. The stack report fails on a broken install.
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python

$(GPU_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade pip
	$(GPU_PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(GPU_PY) -m pip install --quiet -e ".[gpu-dev]"
	$(GPU_PY) -m export.stack_report --require-gpu
	touch $@

gpu-venv: $(GPU_VENV)/.installed

# The GPU tests, failing (not skipping) when the GPU stack is missing or broken.
gpu-test: gpu-venv
	XLNETQA_REQUIRE_GPU=1 $(GPU_PY) -m pytest -m gpu tests

# Export a tiny model, build an engine, serve it (TensorRT and onnxruntime GPU providers), ask once.
gpu-check: gpu-venv
	$(GPU_PY) -m bench.gpu_smoke

clean:
	rm -rf $(VENV) $(GPU_VENV) runs .pytest_cache .ruff_cache
