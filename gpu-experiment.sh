#!/usr/bin/env bash
# The tutorial's experiment on one GPU machine, each job a whole process, tracked offline:
# bench jobs in alternating order (workers 0 2 4 8 0 2 4 8 ...), then one profile job per setting.
#   ./gpu-experiment.sh ROOT [WORKERS] [FIRST_REPEAT] [LAST_REPEAT] [profile|noprofile] [train.py flags...]
# The process is pinned to 4 CPUs (the job's budget in polyaxonfile.yaml); PIN='' turns that off.
set -euo pipefail
cd "$(dirname "$0")"
root=$1; workers=${2:-0 2 4 8}; first=${3:-1}; last=${4:-5}; profile=${5:-profile}
shift $(( $# < 5 ? $# : 5 ))
export POLYAXON_OFFLINE_ROOT=$root POLYAXON_TRACKING_FLUSH_DELAY=0 PYTHONUNBUFFERED=1
PIN=${PIN-taskset -c 0-3}
PY=${PY:-python3}
for repeat in $(seq "$first" "$last"); do
  for w in $workers; do
    echo "=== bench repeat $repeat workers $w $*"
    $PIN "$PY" train.py --mode bench --workers "$w" --device cuda --repeat "$repeat" "$@" 2>&1 | grep -v '^\[W' | grep -E 'bench:|error' || true
  done
done
if [ "$profile" = profile ]; then
  for w in $workers; do
    echo "=== profile workers $w $*"
    $PIN "$PY" train.py --mode profile --workers "$w" --device cuda "$@" 2>&1 | grep -E '^profile:|error' || true
  done
fi
