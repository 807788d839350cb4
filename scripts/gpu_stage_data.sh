#!/usr/bin/env bash
# Split a data file into parts small enough for one device call each, with a SHA-256 manifest, so
# that scripts/gpu_paper_cifar100.sh can reassemble and verify it on the GPU machine.
#
#   bash scripts/gpu_stage_data.sh [--part-mib N] [--dry-run] [SRC] [DEST_DIR]
#
# SRC       the file to split (default: cifar100.npz in the data directories the package searches:
#           $ENTANGLE_DATA, then the checkout's shared/data beside the repository).
# DEST_DIR  where the parts go (default: .gpu_data, ignored by git). It receives
#           <name>.part00, <name>.part01, ... (each at most N MiB, default 55: one part plus the
#           working tree stays under the 64 MiB a device call carries) and <name>.sha256 (the
#           SHA-256 of the whole file and of every part, `sha256sum -c` format).
# --dry-run print what would be written (sizes, number of parts), write nothing.
#
# Then, one part per call (each a few seconds; ignored files stay on a warm machine):
#   run(command="ls -l .gpu_data", carry=[".gpu_data/cifar100.npz.part00", ".gpu_data/cifar100.npz.sha256"])
#   run(command="ls -l .gpu_data", carry=[".gpu_data/cifar100.npz.part01"])  ... and so on.
set -euo pipefail

PART_MIB=55
DRY=0
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --part-mib) PART_MIB=$2; shift 2 ;;
    --part-mib=*) PART_MIB=${1#*=}; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "gpu_stage_data: unknown option $1" >&2; exit 2 ;;
    *) POS+=("$1"); shift ;;
  esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case $PART_MIB in ''|*[!0-9]*) echo "gpu_stage_data: --part-mib takes a whole number of MiB, got '$PART_MIB'" >&2; exit 2 ;; esac
if [ "$PART_MIB" -lt 1 ] || [ "$PART_MIB" -gt 60 ]; then
  echo "gpu_stage_data: --part-mib must be in 1..60 (a device call carries 64 MiB with the working tree), got $PART_MIB" >&2
  exit 2
fi
SRC=${POS[0]:-}
DEST=${POS[1]:-.gpu_data}
if [ -z "$SRC" ]; then
  # the package's own search (the places every loader looks in); its error names them all
  SRC=$("$PY" -c "from entangle_ext.data.root import find_data_file; print(find_data_file('cifar100.npz'))") \
    || { echo "gpu_stage_data: cifar100.npz not found; pass the file as SRC" >&2; exit 2; }
fi
if [ ! -f "$SRC" ]; then
  echo "gpu_stage_data: $SRC is not a file" >&2
  exit 2
fi
name=$(basename "$SRC")
bytes=$(stat -c %s "$SRC")
part_bytes=$((PART_MIB * 1024 * 1024))
nparts=$(( (bytes + part_bytes - 1) / part_bytes ))
echo "gpu_stage_data: $SRC ($bytes bytes) -> $nparts part(s) of at most $PART_MIB MiB in $DEST/"
if [ "$DRY" -eq 1 ]; then
  exit 0
fi
mkdir -p "$DEST"
rm -f "$DEST/$name".part* "$DEST/$name.sha256"
split -b "$part_bytes" -d -a 2 "$SRC" "$DEST/$name.part"
src_abs=$(cd "$(dirname "$SRC")" && pwd)/$(basename "$SRC")
(
  cd "$DEST"
  # the whole file's line names the reassembled file (it is written beside the parts)
  echo "$(sha256sum <"$src_abs" | cut -d' ' -f1)  $name"
  sha256sum "$name".part*
) >"$DEST/$name.sha256.tmp"
mv "$DEST/$name.sha256.tmp" "$DEST/$name.sha256"
ls -l "$DEST/$name".part* "$DEST/$name.sha256"
