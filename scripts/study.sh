#!/usr/bin/env bash
# A measured study on one GPU machine, the tutorial's procedure: bench jobs over the configurations
# in alternating order (repeat 1: c1 c2 c3, repeat 2: c1 c2 c3, ...), then one profile job per
# configuration, each job a whole process, all tracked offline under ROOT; then steplens compare.
#
#   scripts/study.sh ROOT REPEATS [--out DIR] [--baseline LABEL] [--no-profile] [-- train.py flags...]
#
#   CONFIGS='a;b;c'  the configurations, train.py flags separated by ';'
#                    (default: '--workers 0;--workers 4', the tutorial's comparison)
#   PIN              the CPU pinning of every job (default: 'taskset -c 0-3', the job's 4-CPU
#                    budget in polyaxonfile.yaml; PIN= turns it off)
#   PY               the Python that runs the jobs (default: python3)
#
# PY and relative paths in the flags are read from the repository root, where the jobs run.
# Every job gets --device cuda (a study measures the GPU); flags after -- go to every job and come
# last, so `-- --device cpu` overrides it. REPEATS 0 runs the profile jobs only. --out DIR receives
# steplens compare's tables and plot (default: ROOT/comparison) and offline.tar.gz, the runs packed.
# steplens compare reads every run under ROOT: start each study with a fresh ROOT.
# A failing job prints the end of its log (all logs: ROOT/logs/); the study goes on to the next
# job and exits 1 at the end.
set -euo pipefail
usage() { echo "usage: scripts/study.sh ROOT REPEATS [--out DIR] [--baseline LABEL] [--no-profile] [-- train.py flags...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
root=$1 repeats=$2; shift 2
[[ $repeats =~ ^[0-9]+$ ]] || usage
out='' baseline=() profile=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --baseline) [ $# -ge 2 ] || usage; baseline=(--baseline "$2"); shift 2 ;;
    --no-profile) profile=0; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
flags=("$@")
IFS=';' read -r -a configs <<< "${CONFIGS:---workers 0;--workers 4}"
PIN=${PIN-taskset -c 0-3}
PY=${PY:-python3}
mkdir -p "$root/logs" ${out:+"$out"}  # the paths as given, before the cd below
root=$(cd "$root" && pwd) out=${out:+$(cd "$out" && pwd)}
cd "$(dirname "$0")/.."
export POLYAXON_OFFLINE_ROOT=$root POLYAXON_TRACKING_FLUSH_DELAY=0 PYTHONUNBUFFERED=1

n=0 failed=0
# shellcheck source=scripts/jobs.sh
source scripts/jobs.sh  # job MODE REPEAT|- CONFIG: one train.py process, its output in ROOT/logs

for repeat in $(seq 1 "$repeats"); do
  for c in "${configs[@]}"; do job bench "$repeat" "$c"; done
done
if [ "$profile" = 1 ]; then
  for c in "${configs[@]}"; do job profile - "$c"; done
fi

if [ "$repeats" -gt 0 ]; then
  "$PY" -m steplens compare --offline "$root" --out "${out:-$root/comparison}" "${baseline[@]}" ||
    { echo "*** steplens compare FAILED" >&2; failed=$((failed + 1)); }
fi
if [ -n "$out" ] && [ -d "$root/runs" ]; then
  tar -czf "$out/offline.tar.gz" -C "$root" runs
  echo "=== runs packed: $out/offline.tar.gz"
fi
if [ "$failed" -gt 0 ]; then
  echo "*** study.sh: $failed failure(s) ($n jobs, logs in $root/logs)" >&2
  exit 1
fi
