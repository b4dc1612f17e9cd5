#!/usr/bin/env bash
# The tutorial's workers question over more than two settings, on one GPU machine: bench jobs in alternating
# order, one profile job per setting, then steplens decide on each neighbouring pair of settings.
#
#   scripts/workers_sweep.sh ROOT FIRST LAST [--decide]
#
#   WORKERS   the DataLoader worker counts (default '0 1 2 4 8 12'), every job pinned to the job's 4 CPUs
#   FIRST..LAST  the bench repeats to run now (each repeat: every setting once, in order); the profile jobs run
#             with repeat 1, so a sweep can be split over calls on one machine: 1 3, then 4 6 --decide
#   --decide  then steplens compare over ROOT into ROOT/comparison, and steplens decide on each neighbouring
#             pair into ROOT/decisions.md (and .json)
#   PIN, PY   as for scripts/study.sh (default 'taskset -c 0-3', python3)
#   FLAGS     more train.py flags for every job, last (a CPU try: FLAGS='--device cpu --batch-size 4 ...')
set -euo pipefail
usage() { echo "usage: scripts/workers_sweep.sh ROOT FIRST LAST [--decide]" >&2; exit 2; }
[ $# -ge 3 ] || usage
root=$1 first=$2 last=$3 decide=${4:-}
[[ $first =~ ^[1-9][0-9]*$ && $last =~ ^[1-9][0-9]*$ ]] || usage
[ -z "$decide" ] || [ "$decide" = --decide ] || usage
read -r -a workers <<< "${WORKERS:-0 1 2 4 8 12}"
PIN=${PIN-taskset -c 0-3}
PY=${PY:-python3}
read -r -a extra <<< "${FLAGS:-}"
out='' flags=(--data synthetic "${extra[@]}")
mkdir -p "$root/logs"
root=$(cd "$root" && pwd)
cd "$(dirname "$0")/.."
export POLYAXON_OFFLINE_ROOT=$root POLYAXON_TRACKING_FLUSH_DELAY=0 PYTHONUNBUFFERED=1
n=$(find "$root/logs" -name '*.log' | wc -l) failed=0
# shellcheck source=scripts/jobs.sh
source scripts/jobs.sh

for repeat in $(seq "$first" "$last"); do
  for w in "${workers[@]}"; do job bench "$repeat" "--workers $w"; done
  if [ "$repeat" = 1 ]; then
    for w in "${workers[@]}"; do job profile - "--workers $w"; done
  fi
done
if [ "$decide" = --decide ]; then
  "$PY" -m steplens compare --offline "$root" --out "$root/comparison" --baseline "workers=${workers[0]}" > /dev/null ||
    { echo "*** steplens compare FAILED" >&2; failed=$((failed + 1)); }
  "$PY" scripts/decide_pairs.py "$root" "${workers[@]}" || { echo "*** decide_pairs FAILED" >&2; failed=$((failed + 1)); }
fi
[ "$failed" = 0 ] || { echo "*** workers_sweep.sh: $failed failure(s), logs in $root/logs" >&2; exit 1; }
