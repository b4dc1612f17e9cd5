#!/usr/bin/env bash
# The candidate fixes under the tutorial's procedure, on one GPU machine: bench jobs over the
# configurations below in alternating order, then (with "profile") one profile job for each.
#   ./gpu-options.sh ROOT FIRST_REPEAT LAST_REPEAT [profile|noprofile] [train.py flags...]
set -euo pipefail
cd "$(dirname "$0")"
root=$1; first=$2; last=$3; profile=${4:-noprofile}
shift $(( $# < 4 ? $# : 4 ))
export POLYAXON_OFFLINE_ROOT=$root POLYAXON_TRACKING_FLUSH_DELAY=0 PYTHONUNBUFFERED=1
PIN=${PIN-taskset -c 0-3}
PY=${PY:-python3}
# CONFIGS='a;b;c' replaces the list below.
DEFAULT_CONFIGS=(
  "--workers 4"
  "--workers 4 --prefetch-stream"
  "--gpu-input"
  "--gpu-input --channels-last --amp bf16 --fused-sgd"
  "--gpu-input --channels-last --amp bf16 --fused-sgd --compile reduce-overhead"
)
if [ -n "${CONFIGS:-}" ]; then IFS=';' read -r -a CONFIGS <<< "$CONFIGS"; else CONFIGS=("${DEFAULT_CONFIGS[@]}"); fi
modes=()
for repeat in $(seq "$first" "$last"); do modes+=("bench $repeat"); done
[ "$profile" = profile ] && modes+=("profile -")
for m in "${modes[@]}"; do
  set -- $m "$@"; mode=$1; repeat=$2; shift 2
  for c in "${CONFIGS[@]}"; do
    r=(); [ "$repeat" != - ] && r=(--repeat "$repeat")
    echo "=== $mode ${r[*]} $c $*"
    # shellcheck disable=SC2086
    $PIN "$PY" train.py --mode "$mode" --device cuda $c "${r[@]}" "$@" 2>&1 | grep -E '^bench:|^profile:|error' || true
  done
done
