#!/usr/bin/env bash
# One-shot GPU check: build entangle_ext on a machine with an NVIDIA GPU (no network needed: torch and
# the Python test dependencies must already be installed), run the test suite on CUDA, then the
# benchmarks; logs and JSON go into the results directory given as $1 (default ./gpu_results).
# Designed to finish in < 8 minutes on one H200: each step has a time cap (build 150 s, tests
# 150 s, each benchmark 60 s) and a capped step is reported as failed, with its partial log kept.
#
#   bash scripts/gpu_check.sh "$OUT"
set -uo pipefail
OUT_DIR=${1:-gpu_results}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
status=0
# At most 8 files come back from the GPU machine: env.txt, build.log, tests.log, bench.log and one
# JSON per benchmark.
step() {  # step LOG TIMEOUT CMD...: run, append to $OUT_DIR/LOG.log, remember failures
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT_DIR/$name.log"
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "    rc=$rc in $((SECONDS - t0)) s"; tail -n 25 "$OUT_DIR/$name.log"
  [ $rc -eq 0 ] || status=1
  return $rc
}
{
  echo "date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -1
} > "$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"
# Only the GPU present is targeted: faster build, and the binary is built against the local torch.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c "import torch; p=torch.cuda.get_device_capability(); print(f'{p[0]}.{p[1]}')")}
# Editable install: the compiled _C lands in the source tree, so the tests run in place.
step build 150 $PY -m pip install --no-build-isolation --no-deps --no-index -v -e . || { echo "build failed"; exit 1; }
# All tests (CUDA ones included); the CMake test is CI's (it rebuilds everything for the CPU).
step tests 150 $PY -m pytest -q -rs -p no:cacheprovider tests -k "not cmake"
for b in bench/bench_*.py; do
  name=$(basename "$b" .py)
  step bench 60 $PY "$b" --device cuda --json "$OUT_DIR/$name.json"
done
echo "=== done, status $status; results in $OUT_DIR"
exit $status
