# entangle_ext: `make demo` runs the main job on an embedded real dataset, `make test` runs the tests.
# Both create .venv when missing, install torch (a CUDA build, so the CUDA kernels compile even on
# machines without a GPU) and the requirements, and build the package without build isolation.
VENV        ?= .venv
PYTHON      ?= python3
TORCH_SPEC  ?= torch==2.14.1 torchvision==0.29.1
PY          := $(VENV)/bin/python
DEPS_STAMP  := $(VENV)/.deps-$(shell echo '$(TORCH_SPEC)' | tr -c 'a-zA-Z0-9.\n' '_')
export MAX_JOBS ?= 2
PYTEST_ARGS ?=

.PHONY: all demo compare test build build-cpu deps bench gpu-check clean

all: test

$(DEPS_STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH_SPEC)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

deps: $(DEPS_STAMP)

# Editable install: builds entangle_ext/_C*.so in place. Python changes need no rebuild; the
# extension is rebuilt only when a native source or the build scripts change.
NATIVE_SRC  := $(wildcard csrc/*.h csrc/*.cpp csrc/*.txt csrc/cpu/*.h csrc/cpu/*.cpp csrc/cuda/*.cuh csrc/cuda/*.cu) setup.py pyproject.toml
BUILD_STAMP := $(VENV)/.build-stamp

$(BUILD_STAMP): $(DEPS_STAMP) $(NATIVE_SRC)
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	@rm -f $(CPU_STAMP)
	@touch $@

# `make demo` runs on the CPU, so on a checkout without an up-to-date full build it compiles the
# CPU kernels only (ENTANGLE_CPU_ONLY=1: the CUDA kernels for two architectures are most of a
# first build's time); `make build` / `make test` (and so CI) compile and link the CUDA kernels
# too, replacing that CPU-only build, and a later `make demo` reuses theirs.
CPU_STAMP   := $(VENV)/.build-stamp-cpu

$(CPU_STAMP): $(DEPS_STAMP) $(NATIVE_SRC)
	ENTANGLE_CPU_ONLY=1 $(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	@rm -f $(BUILD_STAMP)
	@touch $@

build-cpu: $(CPU_STAMP)
	@ENTANGLE_NO_JIT=1 $(PY) -W ignore -c "import entangle_ext as e, sys; sys.exit(0 if e.available() else 3)" \
	  || { echo "entangle_ext/_C was built for another torch: rebuilding (CPU kernels) for $(TORCH_SPEC)"; \
	       ENTANGLE_CPU_ONLY=1 $(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .; }
	@$(PY) -c "import entangle_ext as e; assert e.available(), e.load_error(); \
	  print('entangle_ext', e.__version__, '| route:', e.build_route(), '| CUDA kernels built:', e.cuda_built())"

# The in-place entangle_ext/_C*.so is shared by every VENV of this checkout: after a build for
# another torch (e.g. VENV=.venv-cpu TORCH_SPEC=torch==2.13.0) it is rebuilt for this one.
build: $(BUILD_STAMP)
	@ENTANGLE_NO_JIT=1 $(PY) -W ignore -c "import entangle_ext as e, sys; sys.exit(0 if e.available() else 3)" \
	  || { echo "entangle_ext/_C was built for another torch: rebuilding for $(TORCH_SPEC)"; \
	       $(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .; }
	@$(PY) -c "import entangle_ext as e; assert e.available(), e.load_error(); \
	  print('entangle_ext', e.__version__, '| route:', e.build_route(), '| CUDA kernels built:', e.cuda_built(), e.cuda_arch_list())"

test: build
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

demo: $(if $(wildcard $(BUILD_STAMP)),build,build-cpu)
	$(PY) -m entangle_ext.demo

# All methods on digits, 3 seeds (a few minutes on CPU); rerunning resumes from runs/compare_digits/cache.
compare: build
	$(PY) -m entangle_ext compare --setting digits --methods all --seeds 3 --out runs/compare_digits

bench: build
	$(PY) bench/bench_w2.py --device cpu

# One capped run on a GPU machine (build for the local GPU, tests, compute-sanitizer, benchmarks,
# summary.txt/json in $(OUT)); GPU_CHECK_ARGS=--dry-run exercises it without a GPU.
GPU_CHECK_ARGS ?=
gpu-check:
	bash scripts/gpu_check.sh $(GPU_CHECK_ARGS) $(or $(OUT),gpu_results)

clean:
	rm -rf build *.egg-info entangle_ext/_C*.so
