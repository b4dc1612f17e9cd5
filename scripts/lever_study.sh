#!/usr/bin/env bash
# The levers past GPU-bound, on one GPU machine: bench jobs of a baseline and its levers in rounds whose
# order turns by one each round (round 1: base l1 l2, round 2: l1 l2 base, round 3: l2 base l1, ...: no
# configuration always runs first), more rounds for the levers that matter most,
# then one lean profile job per configuration (its kernel classes say what shrank), then steplens compare.
#
#   scripts/lever_study.sh ROOT ROUNDS MORE [--out DIR] [--baseline LABEL] [-- train.py flags...]
#
#   CONFIGS='base;l1;l2'  the baseline first, then the levers (train.py flags, ';'-separated): ROUNDS rounds
#   MORE_CONFIGS='base;l1'  the configurations that get MORE rounds after those (default: none)
#   FIRST_ROUND   the first round's number (default 1): a study split over several calls, in one ROOT
#   PROFILE=0     no profile jobs
#   PIN, PY       as in scripts/study.sh
#
# Every job gets --device cuda and --repeat ROUND (steplens compare pairs runs by it); flags after -- go to
# every job and come last. steplens compare's tables go to --out DIR (default ROOT/comparison).
set -euo pipefail
usage() { echo "usage: scripts/lever_study.sh ROOT ROUNDS MORE [--out DIR] [--baseline LABEL] [-- train.py flags...]" >&2; exit 2; }
[ $# -ge 3 ] || usage
root=$1 rounds=$2 more=$3; shift 3
[[ $rounds =~ ^[0-9]+$ && $more =~ ^[0-9]+$ ]] || usage
out='' baseline=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --baseline) [ $# -ge 2 ] || usage; baseline=(--baseline "$2"); shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
flags=("$@")
[ -n "${CONFIGS:-}" ] || { echo "scripts/lever_study.sh: set CONFIGS='baseline;lever;...'" >&2; exit 2; }
IFS=';' read -r -a configs <<< "$CONFIGS"
IFS=';' read -r -a more_configs <<< "${MORE_CONFIGS:-}"
first=${FIRST_ROUND:-1}
[[ $first =~ ^[1-9][0-9]*$ ]] || usage
PIN=${PIN-taskset -c 0-3}
PY=${PY:-python3}
mkdir -p "$root/logs" ${out:+"$out"}
root=$(cd "$root" && pwd) out=${out:+$(cd "$out" && pwd)}
cd "$(dirname "$0")/.."
export POLYAXON_OFFLINE_ROOT=$root POLYAXON_TRACKING_FLUSH_DELAY=0 PYTHONUNBUFFERED=1

n=$(find "$root/logs" -name '*.log' | wc -l) failed=0  # a later call in one ROOT numbers its logs on
# shellcheck source=scripts/jobs.sh
source scripts/jobs.sh  # job MODE REPEAT|- CONFIG [flags...]: one train.py process, its output in ROOT/logs

turned() {  # turned K ITEMS...: the items, one a line, starting at item K (mod their count)
  local k=$1 i; shift
  for ((i = 0; i < $#; i++)); do
    local at=$(( (k + i) % $# + 1 ))
    printf '%s\n' "${!at}"
  done
}
round=$first
for _ in $(seq 1 "$rounds"); do
  mapfile -t order < <(turned $((round - 1)) "${configs[@]}")
  for c in "${order[@]}"; do job bench "$round" "$c"; done
  round=$((round + 1))
done
for _ in $(seq 1 "$more"); do
  [ ${#more_configs[@]} -gt 0 ] || break
  mapfile -t order < <(turned $((round - 1)) "${more_configs[@]}")
  for c in "${order[@]}"; do job bench "$round" "$c"; done
  round=$((round + 1))
done
if [ "${PROFILE:-1}" = 1 ]; then
  for c in "${configs[@]}"; do job profile - "$c" --profile-detail lean; done
fi
"$PY" -m steplens compare --offline "$root" --out "${out:-$root/comparison}" "${baseline[@]}" ||
  { echo "*** steplens compare FAILED" >&2; failed=$((failed + 1)); }
if [ "$failed" -gt 0 ]; then
  echo "*** lever_study.sh: $failed failure(s) ($n jobs, logs in $root/logs)" >&2
  exit 1
fi
