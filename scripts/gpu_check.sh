#!/usr/bin/env bash
# One short GPU check of entangle_ext: build for the local GPU only, CUDA tests, the rest of the
# suite, a compute-sanitizer pass over the `sanitize` tests, the three benchmarks, and a one-screen
# summary. Every step is capped with `timeout`; a failing or capped step is recorded and the run
# goes on to the summary. The caps add up to 300 s (one H200, build included), so a 15-minute
# GPU lease leaves room for the machine start, the paper run and a rerun. Needs only what the GPU image has
# (torch, numpy, pytest, hypothesis, nvcc, ninja; compute-sanitizer and pytest-timeout when there).
#
#   bash scripts/gpu_check.sh [--dry-run] [OUT_DIR]        (OUT_DIR default: $OUT, else gpu_results)
#
# Without a GPU (or with --dry-run) the same steps run in a cheap form: the existing build is
# imported instead of rebuilt, pytest only collects (checking the marker selections), the
# sanitizer is skipped, the benchmarks run tiny CPU problems; the summary is written as usual.
# OUT_DIR receives at most 8 files: summary.txt, summary.json, build.log, tests.log, bench.log and
# bench_w2.json, bench_projection.json, bench_unlearn.json.
set -uo pipefail

DRY=0
OUT_DIR=
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $arg" >&2; exit 2 ;;
    *) OUT_DIR=$arg ;;
  esac
done
OUT_DIR=${OUT_DIR:-${OUT:-gpu_results}}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

# Time caps in seconds (override from the environment). Sum: 300 (tests/build/test_gpu_scripts.py checks
# that this, the paper script and the data staging fit one 15-minute lease with a rerun).
CAP_BUILD=${CAP_BUILD:-100}
CAP_CUDA_TESTS=${CAP_CUDA_TESTS:-45}
CAP_OTHER_TESTS=${CAP_OTHER_TESTS:-35}
CAP_SANITIZER=${CAP_SANITIZER:-15}        # per tool, 4 tools
CAP_BENCH_W2=${CAP_BENCH_W2:-20}
CAP_BENCH_PROJECTION=${CAP_BENCH_PROJECTION:-20}
CAP_BENCH_UNLEARN=${CAP_BENCH_UNLEARN:-20}
TEST_TIMEOUT=${TEST_TIMEOUT:-30}          # per test
# CI-only tests: the CMake build and the nvcc warning check rebuild everything for the CPU.
DESELECT="not cmake and not compile_without_warnings"

# step NAME GROUP CAP CMD...: run CMD under `timeout CAP`, log to $WORK/NAME.log (appended to
# $WORK/GROUP.log for the result files), record "NAME rc seconds cap group note" in steps.tsv.
step() {
  local name=$1 group=$2 cap=$3
  shift 3
  local log="$WORK/$name.log" t0=$SECONDS rc
  echo "=== $name (cap ${cap}s): $*" | tee "$log"
  timeout -k 5 "$cap" "$@" >>"$log" 2>&1
  rc=$?
  local note=""
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then note="timed out"; echo "=== $name: TIMED OUT after ${cap}s" >>"$log"; fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$cap" "$group" "$note" >>"$WORK/steps.tsv"
  echo "    rc=$rc in $((SECONDS - t0))s"
  tail -n 4 "$log" | sed 's/^/    | /'
  cat "$log" >>"$WORK/$group.log"
}
skip() {  # skip NAME GROUP REASON
  echo "=== $1: skipped ($3)" | tee -a "$WORK/$2.log"
  printf '%s\tskip\t0\t0\t%s\t%s\n' "$1" "$2" "$3" >>"$WORK/steps.tsv"
}
has_module() { "$PY" -c "import $1" >/dev/null 2>&1; }
bench_accepts() { grep -q -- "$2" "bench/$1.py"; }

# ---------------------------------------------------------------- environment and mode
MODE=gpu
if [ "$DRY" -eq 1 ]; then
  MODE=dry-run
elif ! nvidia-smi -L >/dev/null 2>&1 || ! "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  MODE=no-gpu
fi
{
  echo "mode: $MODE"
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -nmr) cpus: $(nproc)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  else
    echo "gpu: none (no nvidia-smi)"
  fi
  "$PY" -c "import sys, torch; print('python:', sys.version.split()[0]); print('torch:', torch.__version__); print('torch_cuda:', torch.version.cuda)" 2>&1
  nvcc --version 2>&1 | grep -m1 release | sed 's/^/nvcc: /'
  if command -v compute-sanitizer >/dev/null 2>&1; then
    compute-sanitizer --version 2>&1 | grep -m1 -i version | sed 's/^/compute_sanitizer: /'
  fi
} >"$WORK/env.txt"
cat "$WORK/env.txt"
cat "$WORK/env.txt" >>"$WORK/build.log"

PYTEST=("$PY" -m pytest -q -rfE -p no:cacheprovider)
if has_module pytest_timeout; then TIMEOUT_ARG=(--timeout "$TEST_TIMEOUT"); else TIMEOUT_ARG=(--test-timeout "$TEST_TIMEOUT"); fi
PARALLEL=()
if has_module xdist; then PARALLEL=(-n 8); fi

# ---------------------------------------------------------------- build
if [ "$MODE" = gpu ]; then
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$ARCH}
  rm -f entangle_ext/_C*.so
  step build build "$CAP_BUILD" env FORCE_CUDA=1 "$PY" setup.py build_ext --inplace
else
  step build build "$CAP_BUILD" "$PY" -c "import entangle_ext as e; assert e.available(), e.load_error(); print('existing build: cuda_built', e.cuda_built(), e.cuda_arch_list())"
fi

# ---------------------------------------------------------------- tests
if [ "$MODE" = gpu ]; then
  step tests_cuda tests "$CAP_CUDA_TESTS" "${PYTEST[@]}" "${TIMEOUT_ARG[@]}" -m cuda -k "$DESELECT" tests
  step tests_other tests "$CAP_OTHER_TESTS" "${PYTEST[@]}" "${TIMEOUT_ARG[@]}" "${PARALLEL[@]}" -m "not cuda" -k "$DESELECT" tests
else
  step tests_cuda tests "$CAP_CUDA_TESTS" "${PYTEST[@]}" --collect-only -m cuda -k "$DESELECT" tests
  step tests_other tests "$CAP_OTHER_TESTS" "${PYTEST[@]}" --collect-only -m "not cuda" -k "$DESELECT" tests
fi

# ---------------------------------------------------------------- compute-sanitizer
for tool in memcheck racecheck synccheck initcheck; do
  if [ "$MODE" != gpu ]; then
    skip "sanitizer_$tool" tests "no GPU"
  elif ! command -v compute-sanitizer >/dev/null 2>&1; then
    skip "sanitizer_$tool" tests "compute-sanitizer not found"
  else
    # No caching allocator: each tensor is its own allocation, so an out-of-bounds access or an
    # uninitialised read is not hidden inside a larger cached block.
    step "sanitizer_$tool" tests "$CAP_SANITIZER" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
      compute-sanitizer --tool "$tool" --print-limit 20 \
      "${PYTEST[@]}" -m sanitize -k "$DESELECT" tests
  fi
done
if [ "$MODE" != gpu ]; then
  step sanitize_selection tests 30 "${PYTEST[@]}" --collect-only -m sanitize -k "$DESELECT" tests
fi

# ---------------------------------------------------------------- benchmarks
# The benchmarks size themselves to --time-budget (bench_w2 / bench_projection: when they have it;
# otherwise arguments sized for the cap). Each writes its JSON into OUT_DIR after every case/round.
bench() {  # bench NAME CAP ARGS...
  local name=$1 cap=$2
  shift 2
  rm -f "$OUT_DIR/$name.json"
  step "$name" bench "$cap" "$PY" "bench/$name.py" "$@" --json "$OUT_DIR/$name.json"
}
if [ "$MODE" = gpu ]; then DEV=cuda; else DEV=cpu; fi
budget() { echo $(($1 * 2 / 3)); }  # leave a third of the cap for start-up and warm-up
if bench_accepts bench_w2 --time-budget; then
  bench bench_w2 "$CAP_BENCH_W2" --device "$DEV" --time-budget "$(budget "$CAP_BENCH_W2")"
elif [ "$DEV" = cuda ]; then
  bench bench_w2 "$CAP_BENCH_W2" --device cuda --reps 10
else
  bench bench_w2 "$CAP_BENCH_W2" --device cpu --reps 1
fi
if bench_accepts bench_projection --time-budget && [ "$DEV" = cuda ]; then
  bench bench_projection "$CAP_BENCH_PROJECTION" --device cuda --time-budget "$(budget "$CAP_BENCH_PROJECTION")"
elif bench_accepts bench_projection --time-budget; then   # CPU: the 86M cases alone outlast the cap
  bench bench_projection "$CAP_BENCH_PROJECTION" --device cpu --sizes 1e6,4e6 \
    --time-budget "$(budget "$CAP_BENCH_PROJECTION")"
elif [ "$DEV" = cuda ]; then
  bench bench_projection "$CAP_BENCH_PROJECTION" --device cuda --sizes 11.2e6,125e6 --ks 2,8 --models none --reps 10 --no-loop
else
  bench bench_projection "$CAP_BENCH_PROJECTION" --device cpu --sizes 1e5 --ks 2 --models none --reps 1 --no-loop
fi
if [ "$DEV" = cuda ]; then
  bench bench_unlearn "$CAP_BENCH_UNLEARN" --device cuda --steps 3 --time-budget "$(budget "$CAP_BENCH_UNLEARN")"
else
  bench bench_unlearn "$CAP_BENCH_UNLEARN" --device cpu --steps 1 --batch-limit 1 --scale 0.02 --rounds 1 \
    --time-budget "$(budget "$CAP_BENCH_UNLEARN")"
fi

# ---------------------------------------------------------------- summary and result files
for group in build tests bench; do  # at most 4 MB per log: its head and its tail
  src="$WORK/$group.log"
  [ -f "$src" ] || continue
  if [ "$(wc -c <"$src")" -gt 4000000 ]; then
    { head -c 1000000 "$src"; printf '\n[... cut ...]\n'; tail -c 3000000 "$src"; } >"$OUT_DIR/$group.log"
  else
    cp "$src" "$OUT_DIR/$group.log"
  fi
done
if ! "$PY" scripts/gpu_summary.py --work "$WORK" --out "$OUT_DIR"; then
  { echo "gpu_check ($MODE): the summary script failed; raw step table (name rc seconds cap group note):"
    cat "$WORK/steps.tsv"; } | tee "$OUT_DIR/summary.txt"
  echo '{"error": "gpu_summary.py failed"}' >"$OUT_DIR/summary.json"
fi
status=0
awk -F'\t' '$2 != "0" && $2 != "skip" { bad = 1 } END { exit bad }' "$WORK/steps.tsv" || status=1
rm -rf "$WORK"
exit $status
