#!/usr/bin/env bash
# The issue-6 study on one GPU machine (device tool): alternating bench jobs over CONFIGS, then one
# profile job per configuration, everything tracked offline under ROOT and packed into OUT.
#   ./gpu-study.sh ROOT OUT REPEATS [train.py flags for every job...]
set -euo pipefail
cd "$(dirname "$0")"
root=$1; out=$2; repeats=$3
shift 3
./gpu-options.sh "$root" 1 "$repeats" profile "$@"
tar -C "$root" -czf "$out/offline.tar.gz" runs
python3 compare.py --offline "$root" --out "$out" --baseline workers=4 | tail -n 20
