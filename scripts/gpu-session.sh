#!/usr/bin/env bash
# On the GPU machine (after `source .gpu-stage/b/unpack.sh`): the GPU test tier, then the runs
# behind the committed reports. Logs and results go to $OUT (or ./gpu-out).
#   bash scripts/gpu-session.sh tests        # pytest -m gpu
#   bash scripts/gpu-session.sh gemm-seed    # the seed GEMM ladder + baselines
#   bash scripts/gpu-session.sh gemv         # the GEMV presets, ladder + baselines
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for part in "$@"; do
  case "$part" in
    tests) python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.log" ;;
    gemm-seed)
      python3 runner.py --schedule all --no-ir --results "$out/gemm-seed.jsonl" 2>&1 | tee "$out/gemm-seed.log" ;;
    gemv)
      for preset in gemv-1024 gemv-7168x16384 bgemv-l1 bgemv-l8 bgemv-l4; do
        python3 runner.py --preset "$preset" --schedule all --no-ir --results "$out/gemv.jsonl"
      done 2>&1 | tee "$out/gemv.log" ;;
    *) echo "unknown part '$part' (tests, gemm-seed, gemv)"; exit 2 ;;
  esac
done
