#!/usr/bin/env bash
# The paper's CIFAR-100 protocol on one GPU, time-capped: reassemble and checksum the staged data
# parts (scripts/gpu_stage_data.sh), then scripts/gpu_paper_cifar100.py (original ResNet-18, the
# method and its no-W2 ablation; held-out three-split table, wall clock per stage, JSON).
#
#   bash scripts/gpu_paper_cifar100.sh [--dry-run] [OUT_DIR]     (OUT_DIR default: $OUT, else gpu_results)
#
# Data: the parts and manifest in $STAGE_DIR (default .gpu_data). With --dry-run and no parts
# there, the data file the package finds (cifar100.npz in $ENTANGLE_DATA or the checkout's
# shared/data) is staged into a temporary folder first, so the split/reassemble/checksum path runs
# too. --dry-run: the same code path on the CPU with a tiny budget, and the predicted H200 time.
# Cap: CAP_PAPER seconds for the GPU run (default 200; CAP_PAPER_DRY for --dry-run, default 900; the README's GPU status section gives the 15-minute plan).
# OUT_DIR receives paper_cifar100.json, paper_cifar100.txt and paper_cifar100.log.
set -uo pipefail

DRY=0
OUT_DIR=
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "gpu_paper_cifar100: unknown option $arg" >&2; exit 2 ;;
    *) OUT_DIR=$arg ;;
  esac
done
OUT_DIR=${OUT_DIR:-${OUT:-gpu_results}}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
CAP_PAPER=${CAP_PAPER:-200}
[ "$DRY" -eq 1 ] && CAP_PAPER=${CAP_PAPER_DRY:-900}   # the CPU dry run: slow CPUs, shared machines
STAGE_DIR=${STAGE_DIR:-.gpu_data}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_paper.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT_DIR/paper_cifar100.log"
: >"$LOG"

if [ "$DRY" -eq 1 ] && ! ls "$STAGE_DIR"/cifar100.npz.part* >/dev/null 2>&1; then
  STAGE_DIR="$WORK/stage"
  bash scripts/gpu_stage_data.sh "" "$STAGE_DIR" >>"$LOG" 2>&1 || { tail -n 3 "$LOG" >&2; exit 2; }
fi
MANIFEST="$STAGE_DIR/cifar100.npz.sha256"
if [ ! -f "$MANIFEST" ]; then
  echo "gpu_paper_cifar100: no $MANIFEST: stage the data first (scripts/gpu_stage_data.sh, then carry each part)" | tee -a "$LOG" >&2
  exit 2
fi
# every part listed in the manifest must be here and intact before anything is reassembled
missing=$(awk 'NR > 1 { print $2 }' "$MANIFEST" | while read -r p; do [ -f "$STAGE_DIR/$p" ] || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "gpu_paper_cifar100: parts missing in $STAGE_DIR: $(echo $missing)" | tee -a "$LOG" >&2
  exit 2
fi
if ! (cd "$STAGE_DIR" && tail -n +2 cifar100.npz.sha256 | sha256sum -c --quiet -) >>"$LOG" 2>&1; then
  echo "gpu_paper_cifar100: a part in $STAGE_DIR does not match its checksum (see $LOG); carry it again" | tee -a "$LOG" >&2
  exit 2
fi
DATA="$WORK/cifar100.npz"
awk 'NR > 1 { print $2 }' "$MANIFEST" | (cd "$STAGE_DIR" && xargs cat) >"$DATA"
want=$(head -n 1 "$MANIFEST" | cut -d' ' -f1)
got=$(sha256sum <"$DATA" | cut -d' ' -f1)
if [ "$want" != "$got" ]; then
  echo "gpu_paper_cifar100: the reassembled file's SHA-256 $got is not the manifest's $want" | tee -a "$LOG" >&2
  exit 2
fi
echo "data: reassembled $(stat -c %s "$DATA") bytes, sha256 $got (matches the manifest)" | tee -a "$LOG"

MODE=()
[ "$DRY" -eq 1 ] && MODE=(--dry-run)
timeout -k 5 "$CAP_PAPER" "$PY" scripts/gpu_paper_cifar100.py "$OUT_DIR" --data "$DATA" --work "$WORK/runs" \
  "${MODE[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "gpu_paper_cifar100: TIMED OUT after ${CAP_PAPER}s; paper_cifar100.json holds the phases that finished" | tee -a "$LOG"
fi
exit "$rc"
