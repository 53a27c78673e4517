#!/usr/bin/env bash
# The CPU test tier, as CI runs it (.ci/run): every test but the GPU tier's, in two steps. First
# the quick ones; then those marked slow (searches, RPC farms, worker processes: 10 s or more
# each on a 2-core machine) in a step of their own, time-boxed by $SLOW_LIMIT_S (900 s).
# Arguments go to both pytest runs (e.g. -x). A bare `pytest -m "not gpu"` runs the same tests
# in one step.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pytest -q -m "not gpu and not slow" -n auto "$@" || exit
limit=${SLOW_LIMIT_S:-900}
timeout "$limit" python3 -m pytest -q -m "slow and not gpu" -n auto "$@"
status=$?
if [ "$status" = 124 ]; then
  echo "error: the slow tests ran past their ${limit} s (SLOW_LIMIT_S)" >&2
fi
exit "$status"
