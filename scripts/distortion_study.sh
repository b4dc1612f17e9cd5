#!/usr/bin/env bash
# A study of the profiler's distortion on one GPU machine: for each repeat and configuration, a profile
# job with --profile-detail full, one with --profile-detail lean and a bench job, in an order that turns
# by one each repeat (repeat 1: full lean bench, repeat 2: lean bench full, ...), each job a whole
# process, all tracked offline under ROOT; then scripts/distortion_table.py. It asks whether each
# profile run's 95% interval (the unprofiled steps before and after the capture, docs/EVIDENCE.md)
# holds profiled step / bench step of the same repeat and configuration.
#
#   scripts/distortion_study.sh ROOT REPEATS [--bench-steps N] [--out FILE.md] [-- train.py flags...]
#
#   CONFIGS='a;b;c'  the configurations, train.py flags separated by ';' (default: the four below)
#   PIN              the CPU pinning of every job (default: 'taskset -c 0-3'; PIN= turns it off)
#   PY               the Python that runs the jobs (default: python3)
#   FIRST_REPEAT     the first repeat's number (default 1): a study split over several calls, in one ROOT
#
# --bench-steps: the bench window (default 300). --out: the table (default ROOT/distortion.md).
# Every job gets --device cuda; flags after -- go to every job and come last, so `-- --device cpu`
# overrides it. Start each study with a fresh ROOT: the table reads every run under it.
# A failing job prints the end of its log (all logs: ROOT/logs/); the study goes on and exits 1 at the end.
set -euo pipefail
usage() { echo "usage: scripts/distortion_study.sh ROOT REPEATS [--bench-steps N] [--out FILE.md] [-- train.py flags...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
root=$1 repeats=$2; shift 2
[[ $repeats =~ ^[1-9][0-9]*$ ]] || usage
bench_steps=300 table=''
while [ $# -gt 0 ]; do
  case $1 in
    --bench-steps) [ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || usage; bench_steps=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; table=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
flags=("$@")
IFS=';' read -r -a configs <<< "${CONFIGS:---workers 0;--workers 4;--workers 0 --gpu-input --cuda-graph;--workers 0 --gpu-input --cuda-graph --compile default --amp bf16 --channels-last --fused-sgd --cudnn-benchmark}"
PIN=${PIN-taskset -c 0-3}
PY=${PY:-python3}
mkdir -p "$root/logs"
root=$(cd "$root" && pwd)
case $table in '') table=$root/distortion.md ;; /*) ;; *) table=$PWD/$table ;; esac
cd "$(dirname "$0")/.."
export POLYAXON_OFFLINE_ROOT=$root POLYAXON_TRACKING_FLUSH_DELAY=0 PYTHONUNBUFFERED=1

n=$(find "$root/logs" -name '*.log' | wc -l) failed=0  # a later call in one ROOT numbers its logs on
# shellcheck source=scripts/jobs.sh
source scripts/jobs.sh  # job MODE REPEAT|- CONFIG [flags...]: one train.py process, its output in ROOT/logs

kinds=(full lean bench)
first=${FIRST_REPEAT:-1}
[[ $first =~ ^[1-9][0-9]*$ ]] || usage
for repeat in $(seq "$first" $((first + repeats - 1))); do
  for c in "${configs[@]}"; do
    for i in 0 1 2; do
      kind=${kinds[$(( (i + repeat - 1) % 3 ))]}
      if [ "$kind" = bench ]; then
        job bench "$repeat" "$c" --bench-steps "$bench_steps"
      else
        job profile "$repeat" "$c" --profile-detail "$kind"
      fi
    done
  done
done

"$PY" scripts/distortion_table.py "$root" --out "$table" || { echo "*** distortion_table.py FAILED" >&2; failed=$((failed + 1)); }
if [ "$failed" -gt 0 ]; then
  echo "*** distortion_study.sh: $failed failure(s) ($n jobs, logs in $root/logs)" >&2
  exit 1
fi
