#!/usr/bin/env bash
# On the GPU machine (after `source .gpu-stage/b/unpack.sh`): the GPU test tier, then the runs
# behind the committed reports. Logs and results go to $OUT (or ./gpu-out).
#   bash scripts/gpu-session.sh tests        # pytest -m gpu: 8 at once, then those marked alone
#                                            # ($TESTS_SHARD=a, b, d, then c: the tier in four commands;
#                                            # $TESTS_GPUS="0 1": a run on each of those GPUs at once;
#                                            # TESTS_SHARD="a b d c" TESTS_GPUS="0 1 2 3": a shard each;
#                                            # TESTS_PASSES=5 with $TESTS_GPUS: five whole passes)
#   bash scripts/gpu-session.sh gemm-seed    # the seed GEMM ladder + baselines
#   bash scripts/gpu-session.sh gemv         # the GEMV presets, ladder + baselines
#   bash scripts/gpu-session.sh gemm-ladder  # naive..v6 on the seed shape, 4096^3 and the nt-bf16 case
#   bash scripts/gpu-session.sh tuning-smoke # a few trials of each search, into $OUT only
#   bash scripts/gpu-session.sh ms-gemm ms-gemv   # MetaSchedule, $TRIALS (128) more trials each,
#                                          # over $MS_SPACE (split-k) into reports/tuning/ms-<preset>
#                                          # -<space> (ms-<preset> for TVM's rules alone)
#   bash scripts/gpu-session.sh ms-rungs     # MetaSchedule over $MS_SPACE (v7,v8), $TRIALS (64), on
#                                          # $SHAPE (4096x4096x4096) $DTYPE (float16) $LAYOUT (nn)
#                                          # into reports/tuning/ms-<shape>-<dtype>-<layout>-<space>,
#                                          # then every rung, its best and cuBLAS in one run
#   bash scripts/gpu-session.sh farm         # the farm's GPU tier (tests/test_rpc.py), then the seed
#                                          # GEMM's search ($TRIALS: 64) once for each of $FARM_SETS
#                                          # (here all): here, or through a farm of those GPUs (all,
#                                          # or a list such as 0,1), into $OUT only; $FARM_SEARCH
#                                          # replaces the search (e.g. "--shape 4096x4096x4096
#                                          # --dtype float16 --tune autotvm:v8"), $FARM_TESTS=0
#                                          # skips the tier
#   bash scripts/gpu-session.sh at-gemm at-gemv   # template searches: $TUNERS (grid random xgb)
#   bash scripts/gpu-session.sh tuning-final      # ladder + searches' bests + baselines, one run
#                                                 # per preset of $PRESETS (both)
#   bash scripts/gpu-session.sh peaks        # mma.sync and FFMA ceilings; the kernels cuBLAS runs
#   bash scripts/gpu-session.sh at-v5k at-v5t at-v6 at-v7 at-v8 # xgb over the rung's space:
#                                            # $TRIALS on each of $SHAPES in $DTYPE (float32),
#                                            # $LAYOUT (nn)
#   bash scripts/gpu-session.sh gemm-fp32    # fp32 ladders with the searches' bests, one run a shape
#   bash scripts/gpu-session.sh gemm-16bit   # the same for the fp16/bf16 shapes of gemm-ladder
#   bash scripts/gpu-session.sh profile      # ncu ($NCU: --set detailed) of v6 (fp16) and the best
#                                            # v5k, 4096^3
#   bash scripts/gpu-session.sh odd-shapes   # the GPU tier on the rungs and shapes of issue 21
#   bash scripts/gpu-session.sh shapes       # the shape suites ($SUITES: all three) into shapes.jsonl,
#                                            # every rung or $SHAPES_SCHEDULE's alone
#   bash scripts/gpu-session.sh ab           # $AB_SCHEDULES against each other on $AB_SHAPES
#   bash scripts/gpu-session.sh sweep        # $SWEEP_SCHEDULES (a rung's settings) over the shapes
#                                            # of $SWEEP_SUITE (wide-bf16) at each M of
#                                            # $SWEEP_TOKENS, beside cuBLAS (scripts/sweep_suite.py),
#                                            # then their summary (scripts/sweep_summary.py)
#   bash scripts/gpu-session.sh ragged       # v8's GPU tier, then the ragged-16bit suite (v8 beside
#                                            # cuBLAS), the aligned neighbour of its first shape, v7
#                                            # and v8 on ragged K with a float32 C
#   bash scripts/gpu-session.sh fp8-promote  # v8 on $FP8_SHAPES: promoted sums (the default) and
#                                            # fast accumulation, beside both _scaled_mm forms
#   bash scripts/gpu-session.sh export       # the export tests (pytest -m gpu tests/test_export.py)
#                                            # and the README's nn.Linear example, measured into
#                                            # $out/h100-export.md and .json
#   bash scripts/gpu-session.sh nvfp4        # the nvfp4 GPU tier, bitdecode's and dp4a's grid
#                                            # searches (resumed from reports/tuning/) and the
#                                            # ladder + baselines on the batched seed's shapes
#                                            # ($NVFP4_PRESETS: bgemv-l1 bgemv-l8 bgemv-l4)
#   bash scripts/gpu-session.sh v8           # v8's GPU tier, then the llm-bf16 suite (every rung)
#   bash scripts/gpu-session.sh profile-v8   # ncu ($NCU: --set detailed) of v8 and of cuBLAS
#                                            # (or of $PROFILE_SCHEDULES, e.g. v8 with two tile
#                                            # shapes), one warm launch each (profile_launch.py)
#                                            # per $PROFILE ("shape:dtype:layout:out_dtype ...",
#                                            # default 4096^3 bf16 nt, float32 C)
#   bash scripts/gpu-session.sh ms-tensorcore # MetaSchedule, 32 trials, 1024^3 float16 (tensor
#                                            # cores in the space), into $OUT only
#   bash scripts/gpu-session.sh kernel-times # ncu's duration of each kernel of $SCHEDULE (the
#                                            # best v5k) and of cuBLAS on the seed GEMM (split K:
#                                            # two kernels)
#   bash scripts/gpu-session.sh counters     # ncu counters (tuning.explain record) of the seed GEMM
#                                            # ladder, the fp16 GEMV ladder (two shapes) and v7 -> v8, into
#                                            # $out/counters.jsonl, each ladder timed; the seed ladder
#                                            # once more into $out/counters-repeat.jsonl
#   bash scripts/gpu-session.sh medium-m     # v8's tiles and K splits on medium-M shapes ($MEDIUM_SHAPES)
#                                            # beside cuBLAS, interleaved (scripts/ab_knobs.py)
#   bash scripts/gpu-session.sh linear-fp8   # the fp8 layers' GPU tier (tests/test_linear_fp8.py), then
#                                            # scripts/linear_fp8.py on $FP8_LAYERS (4096x4096)
#   bash scripts/gpu-session.sh split-k-check # every split-K candidate of MetaSchedule's first
#                                            # batch for random states 1 to $STATES (3), each
#                                            # checked in its own process (split_k_batch_check.py);
#                                            # a failing one's module and output in one tar
# The searches resume from, and write to, reports/tuning/ and reports/h100-tuning.jsonl in the
# checkout, and pack them into $OUT/tuning-state.tar at the end.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
results=reports/h100-tuning.jsonl
for part in "$@"; do
  case "$part" in
    tests)  # $TESTS_SHARD a, b or d: a share of the 8-at-once tests each (a: test_gpu.py but
            # its GEMV cases, 6 minutes four at once on a 4-GPU host; d: the linear layers', which
            # tune portfolios, 4-5 minutes each; b: the rest), c: those marked alone (3-5 minutes);
            # $TESTS_GPUS (e.g. "0 1 2 3"): the same at once on each of those GPUs, each run in a
            # copy of the tree with a home and temporary folder of its own, on its share of the
            # cores (taskset: each process sizes its thread pools by the cores it may use); or,
            # where $TESTS_SHARD names one shard per GPU ("a b d c"), each GPU its own: the whole
            # tier at once
      shard_tests() {  # $1: a shard: the pytest arguments that select its tests, into `shard`
        case "$1" in
          a) shard=(tests/test_gpu.py -k "not gemv") ;;
          b) shard=(tests -k "gemv or not test_gpu" --ignore=tests/test_linear.py
                    --ignore=tests/test_linear_fp8.py) ;;
          d) shard=(tests/test_linear.py tests/test_linear_fp8.py) ;;
          *) shard=() ;;
        esac
      }
      tier() {  # $1: the shard (all: every test); $2...: what runs pytest (taskset -c 0-15
                # python3, or python3); $TESTS_FLAGS (-q; -v names each test as it ends, so a run
                # cut short still names its failures)
        local which=$1 shard
        shift
        shard_tests "$which"
        [ "$which" = c ] ||
          "$@" -m pytest -m "gpu and not alone" ${TESTS_FLAGS:--q} -p no:cacheprovider -n 8 \
            --durations=25 "${shard[@]}"  # the slowest tests named: what the tier's time goes to
        case "$which" in
          a|b|d) ;;
          *) "$@" -m pytest -m "gpu and alone" ${TESTS_FLAGS:--q} -p no:cacheprovider ;;
        esac
      }
      on_gpu() {  # $1: the GPU's place in $TESTS_GPUS, $2: the shard, $3: the log's name: the
                  # shard on that GPU and its share of the cores, in a copy of the tree of its own
        local gpu=${gpus[$1]} copy=/tmp/tier-gpu${gpus[$1]}
        rm -rf "$copy" && mkdir -p "$copy/home" "$copy/tmp" && cp -r . "$copy/tree" && rm -rf "$copy/tree/$out"
        ( cd "$copy/tree" && export CUDA_VISIBLE_DEVICES=$gpu HOME=$copy/home TMPDIR=$copy/tmp \
            PYTHONPATH=/tmp/gpu-site:$copy/tree &&
          tier "$2" taskset -c $(($1 * share))-$(($1 * share + share - 1)) python3 \
            > "$out_dir/$3" 2>&1 )
      }
      shards=(${TESTS_SHARD:-all})
      if [ -z "${TESTS_GPUS:-}" ]; then
        tier "${shards[0]}" python3 2>&1 | tee "$out/pytest-gpu${TESTS_SHARD:+-$TESTS_SHARD}.log"
      elif [ -n "${TESTS_PASSES:-}" ]; then  # that many whole passes, shards a d c b of each
        # queued longest first, each GPU taking the next as it finishes one
        out_dir=$(cd "$out" && pwd) gpus=($TESTS_GPUS) queue=$out/passes-queue
        share=$(( $(nproc) / ${#gpus[@]} ))
        for which in a d c b; do seq -f "$which %g" "$TESTS_PASSES"; done > "$queue"
        for i in "${!gpus[@]}"; do
          while job=$(flock "$queue.lock" sh -c 'head -n 1 "$0" && sed -i 1d "$0"' "$queue") && [ -n "$job" ]; do
            set -- $job
            on_gpu "$i" "$1" "pytest-gpu-$1-pass$2.log"
            echo "$(date +%T) pass $2 shard $1 on GPU ${gpus[$i]}, HEAD $(git rev-parse --short HEAD):" \
              "$(tail -n 1 "$out_dir/pytest-gpu-$1-pass$2.log")" >> "$out_dir/passes.log"
          done &
        done
        wait
        rm -f "$queue" "$queue.lock"
        cat "$out_dir/passes.log"
      else
        out_dir=$(cd "$out" && pwd) gpus=($TESTS_GPUS)
        share=$(( $(nproc) / ${#gpus[@]} ))
        for i in "${!gpus[@]}"; do
          on_gpu "$i" "${shards[$i]:-${shards[0]}}" "pytest-gpu-${shards[$i]:-${shards[0]}}-gpu${gpus[$i]}.log" &
        done
        wait
        tail -n 3 "$out_dir"/pytest-gpu-*-gpu*.log
      fi ;;
    nvfp4)
      python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gpu.py -k nvfp4 2>&1 \
        | tee "$out/pytest-gpu-nvfp4.log"
      for preset in ${NVFP4_PRESETS:-bgemv-l1 bgemv-l8 bgemv-l4}; do
        for grid in bitdecode:72 dp4a:108; do  # each template's whole space
          python3 runner.py --preset "$preset" --dtype nvfp4 --tune "autotvm:${grid%:*}" --tuner grid \
            --trials "${grid#*:}" --no-ir --records reports/tuning/autotvm-h100.jsonl \
            --results "$out/nvfp4-search.jsonl"
        done
        python3 runner.py --preset "$preset" --dtype nvfp4 --schedule all --no-ir \
          --records reports/tuning/autotvm-h100.jsonl --results "$out/nvfp4.jsonl"
      done 2>&1 | tee "$out/nvfp4.log" ;;
    counters)
      record() { local file=$1 start=$SECONDS; shift
                 python3 -m tuning.explain record --counters "$out/$file" "$@"; echo "$((SECONDS - start)) s: $*"; }
      { record counters.jsonl --preset gemm-seed naive v1 v2 v3
        for preset in gemv-7168x16384 gemv-1024; do
          record counters.jsonl --preset $preset naive splitk splitk_vec allreduce multirow blockreduce rowalign
        done
        record counters.jsonl --shape 4096x4096x4096 --dtype float16 v7 v8
        record counters-repeat.jsonl --preset gemm-seed naive v1 v2 v3
      } 2>&1 | tee "$out/counters.log" ;;
    ab)  # scripts/ab_knobs.py on each of $AB_SHAPES in $AB_DTYPE (bfloat16) to $AB_OUT_DTYPE
         # (the dtype's default), $AB_LAYOUT (nt), fp8's $AB_SCALES (tensor): $AB_SCHEDULES
         # against each other and cuBLAS
      for shape in ${AB_SHAPES:?AB_SHAPES names the shapes}; do
        python3 scripts/ab_knobs.py --shape "$shape" --dtype "${AB_DTYPE:-bfloat16}" \
          ${AB_OUT_DTYPE:+--out-dtype "$AB_OUT_DTYPE"} ${AB_SCALES:+--scales "$AB_SCALES"} \
          --layout "${AB_LAYOUT:-nt}" --rounds 2 \
          --results "$out/ab.jsonl" --schedules ${AB_SCHEDULES:?AB_SCHEDULES names the settings}
      done 2>&1 | tee -a "$out/ab.log" ;;
    medium-m)
      for shape in ${MEDIUM_SHAPES:-333x8192x8192 256x7168x2048 777x16384x3072 200x14336x4096}; do
        python3 scripts/ab_knobs.py --shape "$shape" --dtype bfloat16 --layout nt --rounds 2 \
          --results "$out/medium-m.jsonl" --schedules v8 v8:block_m=128,block_n=256,split_k=1 \
          v8:block_m=128,block_n=256,split_k=3 v8:block_m=128,block_n=256,split_k=4 \
          v8:block_m=64,block_n=256,split_k=1 v8:block_m=64,block_n=256,split_k=2 \
          v8:block_m=128,block_n=128,split_k=3
      done 2>&1 | tee "$out/medium-m.log" ;;
    linear-fp8)
      { python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_linear_fp8.py
        python3 scripts/linear_fp8.py $(printf -- '--shape %s ' ${FP8_LAYERS:-4096x4096}) \
          --out "$out/linear-fp8.json"; } 2>&1 | tee "$out/linear-fp8.log" ;;
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
    tuning-smoke)
      for search in "--tune autotvm:seed_template --tuner xgb --trials 20 --records $out/smoke-at.jsonl" \
                    "--tune metaschedule --trials 32 --work-dir $out/smoke-ms"; do
        python3 runner.py --shape 512x256x512 $search --no-ir --results "$out/smoke.jsonl"
      done 2>&1 | tee "$out/tuning-smoke.log" ;;
    ms-gemm|ms-gemv)
      preset=$([ "$part" = ms-gemm ] && echo gemm-seed || echo gemv-7168x16384)
      space=${MS_SPACE:-split-k}
      # SIGINT at $MS_LIMIT s: the search stops after its batch and keeps it, and this script
      # still packs the state for the next call to resume from
      timeout -s INT "${MS_LIMIT:-100000}" python3 runner.py --preset "$preset" --tune metaschedule \
        --ms-space "$space" --trials "${TRIALS:-128}" --no-ir --results "$results" \
        --work-dir "reports/tuning/ms-$preset$([ "$space" = tvm ] || echo "-${space//,/-}")" \
        2>&1 | tee -a "$out/$part.log" ;;
    farm)
      [ "${FARM_TESTS:-1}" = 0 ] || python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_rpc.py 2>&1 | tee "$out/pytest-gpu-farm.log"
      search="${FARM_SEARCH:---preset gemm-seed --tune metaschedule} --trials ${TRIALS:-64} --no-ir --results $out/farm.jsonl"
      state() { case "$search" in *autotvm*) echo --records "/tmp/farm-work/$1.jsonl" ;; *) echo --work-dir "/tmp/farm-work/$1" ;; esac; }
      # work dirs outside $OUT: only 8 files come back from it
      mkdir -p /tmp/farm-work
      port=${FARM_PORT:-9190}  # a port per farm: the last one's may not be free yet
      { for gpus in ${FARM_SETS:-here all}; do
          echo "== $gpus"
          if [ "$gpus" = here ]; then
            python3 runner.py $search $(state "here-$$"); continue
          fi
          port=$((port + 1))
          scripts/rpc-farm.sh --key gpus --host 127.0.0.1 --port $port \
            $([ "$gpus" = all ] || echo --gpus "$gpus") \
            > "/tmp/farm-work/ready-$gpus.log" 2>> "$out/farm-servers.log" &
          farm=$!
          for _ in $(seq 120); do grep -q "farm ready" "/tmp/farm-work/ready-$gpus.log" && break; sleep 1; done
          cat "/tmp/farm-work/ready-$gpus.log"
          python3 runner.py $search $(state "farm-$gpus-$$") \
            --rpc-tracker 127.0.0.1:$port --rpc-key gpus
          kill -INT $farm; wait $farm
        done; } 2>&1 | tee -a "$out/farm.log" ;;
    ms-rungs)
      space=${MS_SPACE:-v7,v8}
      args="--shape ${SHAPE:-4096x4096x4096} --dtype ${DTYPE:-float16} --layout ${LAYOUT:-nn}"
      dir="reports/tuning/ms-${SHAPE:-4096x4096x4096}-${DTYPE:-float16}-${LAYOUT:-nn}-${space//,/-}"
      { timeout -s INT "${MS_LIMIT:-100000}" python3 runner.py $args --tune metaschedule \
          --ms-space "$space" --trials "${TRIALS:-64}" --no-ir --results "$results" --work-dir "$dir"
        python3 runner.py $args --schedule all --no-ir --results "$results" --work-dir "$dir"
      } 2>&1 | tee -a "$out/$part.log" ;;
    at-gemm|at-gemv)
      if [ "$part" = at-gemm ]; then target="--preset gemm-seed --tune autotvm:seed_template"
      else target="--preset gemv-7168x16384 --tune autotvm:multirow"; fi
      for tuner in ${TUNERS:-grid random xgb}; do
        trials=$([ "$tuner" = grid ] && echo 144 || echo 36)  # xgb and random: a quarter of it
        python3 runner.py $target --tuner "$tuner" --seed "${SEED:-0}" --trials "$trials" --no-ir \
          --records reports/tuning/autotvm-h100.jsonl --results "$results"
      done 2>&1 | tee -a "$out/$part.log" ;;
    tuning-final)
      for preset_dir in gemm-seed:ms-gemm-seed-v5k gemv-7168x16384:ms-gemv-7168x16384; do
        [ -z "${PRESETS:-}" ] || [[ " $PRESETS " == *" ${preset_dir%%:*} "* ]] || continue
        python3 runner.py --preset "${preset_dir%%:*}" --schedule all --no-ir --results "$results" \
          --work-dir "reports/tuning/${preset_dir#*:}" --records reports/tuning/autotvm-h100.jsonl
      done 2>&1 | tee -a "$out/tuning-final.log" ;;
    peaks)
      { nvcc -O3 -arch=sm_90a -o /tmp/mma_peak scripts/mma_peak.cu && /tmp/mma_peak
        python3 scripts/cublas_kernels.py 1024x512x2048:float32 4096x4096x4096:float32 \
          4096x4096x4096:float16 4096x4096x4096:bfloat16; } 2>&1 | tee "$out/peaks.log" ;;
    at-v5|at-v5p|at-v5k|at-v5t|at-v6|at-v7|at-v8)
      for shape in ${SHAPES:-1024x512x2048 4096x4096x4096}; do
        python3 runner.py --shape "$shape" --dtype "${DTYPE:-float32}" --layout "${LAYOUT:-nn}" \
          --tune "autotvm:${part#at-}" \
          --tuner xgb --trials "${TRIALS:-64}" --no-ir --records reports/tuning/autotvm-h100.jsonl \
          --results "$results"
      done 2>&1 | tee -a "$out/$part.log" ;;
    gemm-fp32)
      { python3 runner.py --preset gemm-seed --schedule all --no-ir --work-dir reports/tuning/ms-gemm-seed-split-k \
          --records reports/tuning/autotvm-h100.jsonl --results "$out/gemm-fp32.jsonl"
        python3 runner.py --shape 4096x4096x4096 --schedule all --no-ir \
          --records reports/tuning/autotvm-h100.jsonl --results "$out/gemm-fp32.jsonl"; } 2>&1 | tee "$out/gemm-fp32.log" ;;
    gemm-16bit)
      for args in "--shape 4096x4096x4096 --dtype float16" "--shape 4096x4096x4096 --dtype bfloat16" \
                  "--shape 4096x4096x4096 --dtype bfloat16 --layout nt" \
                  "--shape 128x128x128 --dtype bfloat16 --layout nt"; do
        python3 runner.py $args --schedule all --no-ir --records reports/tuning/autotvm-h100.jsonl \
          --results "$out/gemm-16bit.jsonl"
      done 2>&1 | tee "$out/gemm-16bit.log" ;;
    profile)
      for args in "--dtype float16 --schedule v6" "--schedule autotvm:v5k --records reports/tuning/autotvm-h100.jsonl"; do
        timeout 240 ncu --kernel-name main_kernel --launch-count 1 ${NCU:---set detailed} \
          python3 runner.py --shape 4096x4096x4096 $args --no-ir --results /tmp/profile.jsonl
      done 2>&1 | tee "$out/profile.log" ;;
    kernel-times)
      # the first launches whose names match: v5k's two kernels, then cuBLAS's (and torch's
      # float64 reference); ncu flushes caches before each
      for kernels in main_kernel 'gemm|splitK'; do
        timeout 240 ncu --kernel-name-base demangled --kernel-name regex:"$kernels" --launch-count 10 \
          --metrics gpu__time_duration.sum python3 runner.py --preset gemm-seed \
          --schedule "${SCHEDULE:-autotvm:v5k}" --records reports/tuning/autotvm-h100.jsonl --no-ir \
          --results /tmp/kernel-times.jsonl
      done 2>&1 | tee "$out/kernel-times.log" ;;
    v8)
      timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gpu.py -k v8 2>&1 \
        | tee "$out/pytest-gpu-v8.log"
      python3 runner.py --suite llm-bf16 --results "$out/shapes.jsonl" 2>&1 | tee -a "$out/shapes.log" ;;
    profile-v8)
      for workload in ${PROFILE:-4096x4096x4096:bfloat16:nt:float32}; do
        IFS=: read -r shape dtype layout out_dtype <<< "$workload"
        for schedule in ${PROFILE_SCHEDULES:-v8 cublas}; do
          echo "=== $schedule $shape $dtype $layout -> $out_dtype"
          timeout 240 ncu --kernel-name-base demangled --kernel-name regex:'main_kernel|nvjet|xmma' \
            --launch-skip 2 --launch-count 1 ${NCU:---set detailed} python3 scripts/profile_launch.py \
            --shape "$shape" --dtype "$dtype" --layout "$layout" --out-dtype "$out_dtype" \
            --schedule "$schedule"
        done
      done 2>&1 | tee "$out/profile-v8.log" ;;
    ms-tensorcore)
      python3 runner.py --shape 1024x1024x1024 --dtype float16 --tune metaschedule --trials 32 \
        --no-ir --work-dir "$out/ms-tensorcore" --results "$out/ms-tensorcore.jsonl" 2>&1 \
        | tee "$out/ms-tensorcore.log" ;;
    odd-shapes)
      # the GPU tier on what issue 21 changed: v6/v7 on ragged 16-bit shapes, every GEMV rung,
      # every rung on the odd shapes (1x1x1, ...), v7's knobs on padded tiles
      python3 -m pytest -m gpu -q -p no:cacheprovider -k "(schedule_is_correct and (v6 or v7 or gemv \
        or 1x1x1 or 17x250x66 or 1000x136x200)) or v7_is_correct" 2>&1 | tee "$out/pytest-odd-shapes.log" ;;
    shapes)
      for suite in ${SUITES:-fp32-ragged llm-gemv llm-bf16}; do
        python3 runner.py --suite "$suite" ${SHAPES_SCHEDULE:+--schedule "$SHAPES_SCHEDULE"} \
          --results "$out/shapes.jsonl"
      done 2>&1 | tee -a "$out/shapes.log" ;;
    sweep)
      for tokens in ${SWEEP_TOKENS:-48 300 700 2500}; do
        python3 scripts/sweep_suite.py --suite "${SWEEP_SUITE:-wide-bf16}" --tokens "$tokens" \
          --results "$out/sweep.jsonl" --schedules ${SWEEP_SCHEDULES:-v8}
      done 2>&1 | tee -a "$out/sweep.log"
      python3 scripts/sweep_summary.py "$out/sweep.jsonl" | tee "$out/sweep-summary.md" ;;
    ragged)
      { python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gpu.py -k "v8"
        python3 runner.py --suite ragged-16bit --schedule v8 --results "$out/ragged.jsonl"
        python3 runner.py --shape 2000x3000x4096 --dtype bfloat16 --out-dtype bfloat16 --layout nt \
          --schedule v8 --no-ir --results "$out/ragged.jsonl"
        for rung in v7 v8; do
          python3 runner.py --shape 4096x4096x4095 --dtype bfloat16 --layout nt --schedule "$rung" \
            --no-ir --results "$out/ragged.jsonl"
        done; } 2>&1 | tee "$out/ragged.log" ;;
    fp8-promote)
      for shape in ${FP8_SHAPES:-2048x10240x8192 1000x4096x14336 128x14336x4096 16x6144x4096}; do
        for knobs in "" ":promote_k=none"; do
          python3 runner.py --shape "$shape" --dtype float8_e4m3fn --schedule "v8$knobs" --no-ir \
            --results "$out/fp8-promote.jsonl"
        done
      done 2>&1 | tee "$out/fp8-promote.log" ;;
    export)
      { python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_export.py
        python3 scripts/export_example.py --report "$out/h100-export.md"; } 2>&1 | tee "$out/export.log" ;;
    split-k-check)
      python3 scripts/split_k_batch_check.py --states "${STATES:-3}" --out /tmp/split-k-check 2>&1 \
        | tee "$out/split-k-check.log"
      tar cf "$out/split-k-check.tar" -C /tmp split-k-check ;;
    *) echo "unknown part '$part' (tests, gemm-seed, gemv, gemm-ladder, tuning-smoke, ms-gemm,"\
            "ms-gemv, at-gemm, at-gemv, tuning-final, peaks, at-v5, at-v5p, at-v5k, at-v5t, at-v6, at-v7, gemm-fp32, gemm-16bit,"\
            "profile, kernel-times, odd-shapes, shapes, ragged, fp8-promote, export, split-k-check)"; exit 2 ;;
  esac
done
# the searches' state, in one file (a call brings back at most 8), for the next call to resume
# from: unpack it here with `tar -xf FILES_AT/tuning-state.tar` in the checkout, then commit.
tar -cf "$out/tuning-state.tar" --exclude=logs "$results" reports/tuning 2>/dev/null
true
