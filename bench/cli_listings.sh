#!/usr/bin/env bash
# Seconds of `t5lite models` and `t5lite tasks list` on a first call (median of 3 runs each):
# wall time and CPU time (user + sys, which a loaded box inflates less). Each run starts with
# an empty $T5LITE_CACHE_DIR (older trees cached the listings there).
# Usage: bash bench/cli_listings.sh [SRC_DIR]. SRC_DIR (default: this checkout) goes on
# PYTHONPATH, so an older tree can be timed the same way, e.g.
# `git archive <commit> | tar -x -C /tmp/old && bash bench/cli_listings.sh /tmp/old`.
set -euo pipefail
SRC=${1:-$(cd "$(dirname "$0")/.." && pwd)}
export PYTHONPATH=$SRC JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3
export T5LITE_CACHE_DIR=$(mktemp -d)
cd "$T5LITE_CACHE_DIR/.."  # not a source tree: `python -m` puts the cwd first on sys.path
run() {  # run LABEL ARGS...
  local label=$1; shift
  python3 - "$label" "$@" <<'PY'
import os, resource, shutil, statistics, subprocess, sys, time
label, args = sys.argv[1], sys.argv[2:]
walls, cpus = [], []
for _ in range(3):
    shutil.rmtree(os.environ["T5LITE_CACHE_DIR"], ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "t5lite.cli", *args], check=True,
                   stdout=subprocess.DEVNULL)
    walls.append(time.time() - t0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
print(f"{label}: wall median {statistics.median(walls):.2f} s, cpu median "
      f"{statistics.median(cpus):.2f} s (wall runs: {' '.join(f'{w:.1f}' for w in walls)})")
PY
}
echo "src=$(python3 -c 'import os, t5lite; print(os.path.dirname(os.path.dirname(t5lite.__file__)))') load=$(cut -d' ' -f1-3 /proc/loadavg)"
run "models (first call)" models
run "tasks list (first call)" tasks list
rm -rf "$T5LITE_CACHE_DIR"
