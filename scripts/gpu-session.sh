#!/usr/bin/env bash
# On the GPU machine (after `source .gpu-stage/b/unpack.sh`): the GPU test tier, then the runs
# behind the committed reports. Logs and results go to $OUT (or ./gpu-out).
#   bash scripts/gpu-session.sh tests        # pytest -m gpu
#   bash scripts/gpu-session.sh gemm-seed    # the seed GEMM ladder + baselines
#   bash scripts/gpu-session.sh gemv         # the GEMV presets, ladder + baselines
#   bash scripts/gpu-session.sh gemm-ladder  # naive..v6 on the seed shape, 4096^3 and the nt-bf16 case
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
    gemm-ladder)
      for args in "--shape 1024x512x2048" "--shape 4096x4096x4096" \
                  "--shape 4096x4096x4096 --dtype float16" "--shape 4096x4096x4096 --dtype bfloat16" \
                  "--shape 4096x4096x4096 --dtype bfloat16 --layout nt" \
                  "--shape 128x128x128 --dtype bfloat16 --layout nt"; do
        python3 runner.py $args --schedule all --no-ir --results "$out/gemm-ladder.jsonl"
      done 2>&1 | tee "$out/gemm-ladder.log" ;;
    *) echo "unknown part '$part' (tests, gemm-seed, gemv, gemm-ladder)"; exit 2 ;;
  esac
done
