#!/usr/bin/env bash
# Wall seconds of `t5lite models` and `t5lite tasks list` (median of 3 runs each), cold (empty
# listings cache: computed) and warm (cached). Usage: bash bench/cli_listings.sh [SRC_DIR]
# SRC_DIR (default: this checkout) goes on PYTHONPATH, so an older tree can be timed the same
# way, e.g. `git archive <commit> | tar -x -C /tmp/old && bash bench/cli_listings.sh /tmp/old`.
set -euo pipefail
SRC=${1:-$(cd "$(dirname "$0")/.." && pwd)}
export PYTHONPATH=$SRC JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3
export T5LITE_CACHE_DIR=$(mktemp -d)
cd "$T5LITE_CACHE_DIR/.."  # not a source tree: `python -m` puts the cwd first on sys.path
median() { python3 -c "import sys, statistics; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" "$@"; }
run() {  # run LABEL CLEAR(0/1) ARGS...
  local label=$1 clear=$2; shift 2
  local times=()
  for _ in 1 2 3; do
    [ "$clear" = 1 ] && rm -rf "$T5LITE_CACHE_DIR"/*
    local t0=$(date +%s.%N)
    python -m t5lite.cli "$@" > /dev/null
    times+=($(python3 -c "print($(date +%s.%N) - $t0)"))
  done
  echo "$label: median $(median "${times[@]}") s (runs: ${times[*]})"
}
echo "src=$(python -c 'import os, t5lite; print(os.path.dirname(os.path.dirname(t5lite.__file__)))') load=$(cut -d' ' -f1-3 /proc/loadavg)"
run "models cold" 1 models
run "models warm" 0 models
run "tasks list cold" 1 tasks list
run "tasks list warm" 0 tasks list
rm -rf "$T5LITE_CACHE_DIR"
