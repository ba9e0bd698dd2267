#!/bin/bash
# The expert tiers on the GPU machine (the device tool's `run`): GPU tests of the tiers and the kernels
# they changed, then Strata at VRAM caps on a synthetic file written there. Run from the repo root.
#   perf/run_tiers.sh [tests] [bench]   (output under ${OUT:-/tmp/out})
# ARCH / SHAPE pick the synth file (default qwen3next 80b-a3b, 42 GiB; ARCH=qwen4exp SHAPE=seeds the flagship of
# perf/synth_qwen4exp.py, 45 GiB), SKEW its router skew (default 0, uniform);
# CAPS the VRAM budgets in MiB (commas); the `policies` step runs bench_gpu.py at CAP (default 22528) once per
# RUNS entry (policy:swap-budget[:out|:in], see below), after WARM (default 256) decode tokens (RECORD=1: each run's
# routes to $OUT/routes_*.npz, for `strata tiers simulate --recorded`);
# the `prefetch` step runs bench_gpu.py at CAP once per --prefetch value in PREFETCHES (default 0,1,2,3);
# the `lowram` step runs bench_gpu.py at CAP once per --ram-budget-mib value in RAMS (default 0,20736: every
# expert pinned, then half the 80B's experts, the rest read from the file's mapping, warm after the synth wrote it);
# the `long` step runs perf/bench_long.py at CAP once per LONG_RUNS entry (splits:kv-type:contexts, all on the
# plan of N_CTX positions, default 262272; CHUNK: bench_long's --chunk, the prompt rows a pass, default 4096;
# LONG_ARGS adds bench_long options, `--prompt-rows 4096` for chunk passes against the wide ones);
# PCIE_FRACS the --pcie-frac values per cap (default auto); BENCH_ARGS adds perf/bench_tiers.py options; LLAMA_BIN (a llama.cpp CUDA build's bin) sweeps llama.cpp in the
# same run, else (80B only) its earlier numbers come from perf/peer_tiers_2026-12-02.json. REUSE=1 keeps a file already written. Carried in (git-ignored): .whl/, .gpu_fixtures/ (see run_gpu.sh).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${*:-tests bench}
PREFETCHES=${PREFETCHES:-0,1,2,3}
RAMS=${RAMS:-0,20736}
source perf/device_setup.sh
ARCH=${ARCH:-qwen3next}; SHAPE=${SHAPE:-80b-a3b}
MODEL=/tmp/$ARCH-$SHAPE-q4_k.gguf
case " $STEPS " in *" bench "*|*" policies "*|*" prefetch "*|*" long "*|*" lowram "*)
  start_synth ;; esac
case " $STEPS " in *" tests "*)
  (cd /tmp && timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -rA -s -p no:cacheprovider -W "ignore:::cupy" \
    ${TEST_K:+-k "$TEST_K"} $REPO/tests/test_gpu_tiers.py $REPO/tests/test_gpu_share.py ${TEST_FILES:-} >"$OUT/tests.log" 2>&1)
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|cache |Error|error" "$OUT/tests.log" | tail -40 ;; esac
# llama.cpp's earlier numbers are of the 80B file only
PEER=""; [ -z "${LLAMA_BIN:-}" ] && [ "$ARCH-$SHAPE" = qwen3next-80b-a3b ] \
  && PEER="--llama-json $REPO/perf/peer_tiers_2026-12-02.json"
case " $STEPS " in *" bench "*)
  wait $SYNTH_PID; tail -2 "$OUT/synth.log"
  timeout ${BENCH_TIMEOUT:-600} python3 $REPO/perf/bench_tiers.py --model $MODEL --caps ${CAPS:-22528,11264,7168} \
    ${LLAMA_BIN:+--llama-bin $LLAMA_BIN} $PEER \
    --pcie-fracs ${PCIE_FRACS:-auto} --out "$OUT/tiers" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v "^WARNING" | grep -E "strata|probe|share|misses|tok/s|cap|\\||^ +[0-9]" | tail -60 ;; esac
case " $STEPS " in *" policies "*)
  wait $SYNTH_PID 2>/dev/null; tail -2 "$OUT/synth.log"
  # RUNS: policy:swap-budget-MiB[:out|:in] each; out counts a routing profile, in fills the cache from it
  for spec in ${RUNS:-adaptive:64:out static:64:in static:64 adaptive:16 lru:64}; do
    IFS=: read -r pol budget prof <<<"$spec"
    extra=""; [ "$prof" = out ] && extra="--routing-profile-out /tmp/profile.npz"
    [ "$prof" = in ] && extra="--routing-profile-in /tmp/profile.npz"
    [ -n "${RECORD:-}" ] && extra="$extra --record-routes $OUT/routes_${pol}_${budget}${prof:+_$prof}.npz"
    echo "== $spec"
    timeout ${BENCH_TIMEOUT:-300} python3 $REPO/perf/bench_gpu.py --model $MODEL --vram-budget-mib ${CAP:-22528} \
      --prompts ${PROMPTS:-512,4096} --gen 64 --batches 1,4 --pcie-frac 1 --cache-policy $pol --swap-budget-mib $budget \
      --warm-decode ${WARM:-256} $extra --no-table --json "$OUT/policy_${pol}_${budget}${prof:+_$prof}.json" ${BENCH_ARGS:-} 2>&1 \
      | grep -v "^WARNING" | grep -E "strata|swaps|warm|hit rate|VRAM|pre-filled|rc=|Error|error" | tail -20
  done ;; esac
case " $STEPS " in *" prefetch "*)
  wait $SYNTH_PID 2>/dev/null; tail -2 "$OUT/synth.log"
  for k in ${PREFETCHES//,/ }; do
    echo "== --prefetch $k"
    timeout ${BENCH_TIMEOUT:-300} python3 $REPO/perf/bench_gpu.py --model $MODEL --vram-budget-mib ${CAP:-22528} \
      --prompts ${PROMPTS:-512} --gen ${GEN:-64} --batches ${BATCHES:-1,4} --pcie-frac 1 --prefetch $k --no-table \
      --json "$OUT/prefetch_$k.json" ${BENCH_ARGS:-} 2>&1 | grep -v "^WARNING" \
      | grep -E "strata|lookahead|hit rate|VRAM|rc=|Error|error" | tail -20
  done ;; esac
case " $STEPS " in *" lowram "*)
  wait $SYNTH_PID 2>/dev/null; tail -2 "$OUT/synth.log"
  for ram in ${RAMS//,/ }; do
    echo "== --ram-budget-mib $ram"
    timeout ${BENCH_TIMEOUT:-300} python3 $REPO/perf/bench_gpu.py --model $MODEL --vram-budget-mib ${CAP:-22528} \
      --prompts ${PROMPTS:-512} --gen ${GEN:-64} --batches ${BATCHES:-1,4} --ram-budget-mib $ram --no-table \
      --json "$OUT/lowram_$ram.json" ${BENCH_ARGS:-} 2>&1 | grep -v "^WARNING" \
      | grep -E "strata|RAM|mapping|share|hit rate|VRAM|rc=|Error|error" | tail -20
  done ;; esac
case " $STEPS " in *" long "*)
  wait $SYNTH_PID 2>/dev/null; tail -2 "$OUT/synth.log"
  # LONG_RUNS: splits:kv-type:contexts[:resident[:grow]] each, every run on the same plan (N_CTX); resident: the
  # --kv-resident cells (0: all in VRAM), grow: 1 for --kv-grow
  for spec in ${LONG_RUNS:-128:int8:4096,32768,131072,262144 1:int8:4096,131072 128:f16:4096,131072}; do
    IFS=: read -r sp kv ctx res grow <<<"$spec"
    extra="--kv-resident ${res:-0}"; [ "${grow:-0}" = 1 ] && extra="$extra --kv-grow"
    echo "== splits $sp, KV $kv, resident ${res:-all}, grow ${grow:-0}"
    timeout ${BENCH_TIMEOUT:-300} python3 $REPO/perf/bench_long.py --model $MODEL --vram-budget-mib ${CAP:-22528} \
      --contexts $ctx --splits $sp --kv-type $kv --n-ctx ${N_CTX:-262272} ${CHUNK:+--chunk $CHUNK} $extra ${LONG_ARGS:-} \
      --json "$OUT/long_${sp}_${kv}_${res:-0}_${grow:-0}${CHUNK:+_c$CHUNK}.json" \
      2>&1 | grep -v "^WARNING" | grep -E "strata ctx|loaded|Error|error" | tail -12
  done ;; esac
