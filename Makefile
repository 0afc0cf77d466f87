# Two commands do everything on a fresh clone: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
DEMO_DIR ?= runs/demo
TEST_WORKERS ?= 2

.PHONY: venv browser redis demo test lint docs format clean gpu-venv gpu-venv-tensorrt gpu-test gpu-check ort-gpu-venv

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

# Debian's redis-server for tests/test_server_limits_redis.py (--limits-redis against a real store), installed
# here when root, as in CI; elsewhere those tests skip and say so.
redis:
	@if ! command -v redis-server >/dev/null; then \
		if [ "$$(id -u)" != 0 ]; then \
			echo "make: redis-server is missing (its tests skip): sudo apt-get install redis-server" >&2; \
		else \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
		fi; \
	fi

# The suite runs on TEST_WORKERS pytest-xdist workers, then the tests marked serial (timing comparisons)
# alone. Also the onnxruntime-gpu venv for tests/test_provider_fallback.py, where this Python and platform have
# its wheel and the package index answers; otherwise those tests skip, and the reason is printed here.
test: venv browser redis
	@if $(PYTHON) -m export.gpu_versions --index $(PYPI_INDEX) && $(MAKE) --no-print-directory ort-gpu-venv; then \
		export XLNETQA_ORT_GPU_PYTHON=$(ORT_GPU_VENV)/bin/python; \
	else \
		echo "make test: WARNING: no onnxruntime-gpu venv (see above): its tests skip" >&2; \
	fi; \
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not serial" tests && $(PY) -m pytest -m serial tests

# Quality gates (CI runs them before the tests): formatting, lint, types, import layering.
lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site into site/ (strict: a broken link, anchor or page fails the build).
docs: venv
	$(VENV)/bin/mkdocs build --strict

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# ---- NVIDIA machines ------------------------------------------------------------------------------
# A separate venv with onnxruntime-gpu only (never the CPU wheel, which would shadow its providers), in
# two parts, because TensorRT's PyPI packages are stubs that download the real wheels from NVIDIA's own
# index at install time:
#   make gpu-venv           onnxruntime-gpu + the NVIDIA CUDA / cuDNN 9 runtime wheels (all on PyPI),
#                           then the stack report: which providers really load here;
#   make gpu-venv-tensorrt  adds TensorRT 10.14 to it (needs $(NVIDIA_INDEX)).
# The stack is the one this machine's NVIDIA driver runs (python -m export.gpu_versions --driver):
# `gpu` (CUDA 13, driver >= 580) or `gpu-cu12` (CUDA 12, driver >= 525.60.13); GPU_EXTRA=gpu-cu12 picks
# one. torch==$(TORCH_VERSION) from PyPI is the CUDA 13 build (its NVIDIA wheels are the ones onnxruntime-gpu
# loads), so the CUDA 12 stack takes torch from PyTorch's own index: TORCH_INDEX=https://download.pytorch.org/whl/cu12x.
# Serving (onnx GPU providers, TensorRT) does not need torch; the exporter and the torch backend do.
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_EXTRA ?=
TORCH_INDEX ?=
GPU_VERSIONS = $(PYTHON) -m export.gpu_versions $(if $(GPU_EXTRA),--extra $(GPU_EXTRA))
NVIDIA_INDEX ?= https://pypi.nvidia.com
PYPI_INDEX ?= $(or $(PIP_INDEX_URL),https://pypi.org/simple/)
GPU_TEST_FILES = $$(grep -l "mark.gpu" tests/test_*.py)

$(GPU_VENV)/.installed: pyproject.toml qa_core/runtime/gpu_stacks.py
	$(GPU_VERSIONS) --index $(PYPI_INDEX)
	@extra=$$($(GPU_VERSIONS) --print extra) || exit 1; \
	if [ "$$extra" != gpu ] && [ -z "$(TORCH_INDEX)" ]; then \
		echo "make gpu-venv: the $$extra stack needs a torch built for its CUDA (PyPI's torch is CUDA 13): TORCH_INDEX=https://download.pytorch.org/whl/cu12x" >&2; \
		exit 1; \
	fi; \
	set -ex; \
	$(PYTHON) -m venv $(GPU_VENV); \
	$(GPU_PY) -m pip install --quiet --upgrade pip; \
	$(GPU_PY) -m pip install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	$(GPU_PY) -m pip install --quiet -e ".[$$extra,export-core,client,test-tools]"
	$(GPU_PY) -m export.stack_report
	touch $@

$(GPU_VENV)/.tensorrt: $(GPU_VENV)/.installed
	$(GPU_VERSIONS) --tensorrt --index $(NVIDIA_INDEX)
	@extra=$$($(GPU_VERSIONS) --print extra) && trt=$$($(GPU_VERSIONS) --print tensorrt-extra) || exit 1; \
	set -x; $(GPU_PY) -m pip install --quiet -e ".[$$extra,export-core,client,test-tools,$$trt]"
	$(GPU_PY) -m export.stack_report --require-gpu
	touch $@

gpu-venv: $(GPU_VENV)/.installed
gpu-venv-tensorrt: $(GPU_VENV)/.tensorrt

# The GPU tests, failing (not skipping) when the GPU stack is missing or broken. Where the GPU venv cannot
# be made (a GPU machine with no package index), the machine's own Python runs the GPU tests it can: a CUDA
# device is still required, and tests whose packages it lacks are skipped, naming the package.
# Only an unreachable package index (or a Python without the wheels) lets them fall back; a venv that
# could be built but is broken (e.g. TensorRT installed and failing its stack report) fails the target.
gpu-test:
	@py=$(GPU_PY); mode=1; \
	if ! $(MAKE) --no-print-directory gpu-venv-tensorrt; then \
		$(GPU_VERSIONS) --tensorrt --index $(NVIDIA_INDEX) && exit 1; \
		mode=device; \
		if ! $(MAKE) --no-print-directory gpu-venv; then \
			$(GPU_VERSIONS) --index $(PYPI_INDEX) && exit 1; \
			py=$(PYTHON); \
		fi; \
		echo "make gpu-test: the GPU venv is incomplete: running the GPU tests with $$py (a CUDA device is required; tests needing packages it lacks are skipped, naming them)" >&2; \
	fi; \
	XLNETQA_REQUIRE_GPU=$$mode $$py -m pytest -p no:cacheprovider -m gpu $(GPU_TEST_FILES)

# Export a tiny model, build an engine, serve it (TensorRT, onnxruntime GPU providers, torch on CUDA)
# and ask; with an incomplete venv the stages whose packages are missing are reported by name.
gpu-check:
	@py=$(GPU_PY); \
	if ! $(MAKE) --no-print-directory gpu-venv-tensorrt; then \
		$(GPU_VERSIONS) --tensorrt --index $(NVIDIA_INDEX) && exit 1; \
		if ! $(MAKE) --no-print-directory gpu-venv; then \
			$(GPU_VERSIONS) --index $(PYPI_INDEX) && exit 1; \
			py=$(PYTHON); \
		fi; \
	fi; \
	$$py -m bench.gpu_smoke

# onnxruntime-gpu without the NVIDIA libraries, beside the CPU venv: the "CUDA libraries missing" case
# the server must refuse (tests/test_provider_fallback.py runs servers in it). CPU machines and CI: the
# default stack's onnxruntime-gpu (on a GPU machine, the one its driver runs), with no [cuda,cudnn] extra.
ORT_GPU_VENV ?= .venv-ortgpu
$(ORT_GPU_VENV)/.installed: pyproject.toml qa_core/runtime/gpu_stacks.py
	$(PYTHON) -m venv $(ORT_GPU_VENV)
	$(ORT_GPU_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ORT_GPU_VENV)/bin/python -m pip install --quiet "onnxruntime-gpu==$$($(PYTHON) -m export.gpu_versions --print onnxruntime-gpu)" -e ".[serve-core]"
	touch $@

ort-gpu-venv: $(ORT_GPU_VENV)/.installed

clean:
	rm -rf $(VENV) $(GPU_VENV) $(ORT_GPU_VENV) runs .pytest_cache .ruff_cache
