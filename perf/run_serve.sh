#!/bin/bash
# The server in front of the engine on the GPU machine (the device tool's `run`): the decode pipeline's GPU
# tests, the engine's own decode (bench_gpu.py), then the same file served and driven by `strata bench`.
#   perf/run_serve.sh [tests] [engine] [serve]   (default: all three; output under ${OUT:-/tmp/out})
# ARCH / SHAPE / SKEW pick the synth file (default qwen3next 80b-a3b, uniform routing); REUSE=1 keeps one already
# written. CAP (MiB) runs engine and server under a VRAM budget (default: all-resident) with POLICY (default
# static); SERVE_ARGS adds serve flags (--verbose logs each window and the pacer), BENCH_ARGS `strata bench` flags; AHEADS the --decode-ahead values to serve with (default on); SCENARIOS, LEVELS, TOKENS and LONG are `strata bench`'s --scenarios, --concurrency, --tokens and --long-prompt (its JSON and plots land in $OUT/serve_$ahead).
# Carried in (git-ignored): .whl/ (gguf, starlette, sse-starlette, uvicorn, pydantic and what they need),
# .gpu_fixtures/ (the Qwen3 tokenizer for the synth writer).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${*:-tests engine serve}
source perf/device_setup.sh
ARCH=${ARCH:-qwen3next}; SHAPE=${SHAPE:-80b-a3b}
MODEL=/tmp/$ARCH-$SHAPE-q4_k.gguf
TIER_ARGS=""; [ -n "${CAP:-}" ] && TIER_ARGS="--vram-budget-mib $CAP --cache-policy ${POLICY:-static} --pcie-frac 1"
case " $STEPS " in *" engine "*|*" serve "*)
  start_synth ;; esac
case " $STEPS " in *" tests "*)
  (cd /tmp && timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -rA -s -p no:cacheprovider -W "ignore:::cupy" \
    -k "${TEST_K:-sampler or pipeline or draw}" $REPO/tests/test_gpu_refs.py $REPO/tests/test_gpu_kernels.py \
    $REPO/tests/test_gpu_model.py $REPO/tests/test_gpu_tiers.py $REPO/tests/test_gpu_turns.py >"$OUT/tests.log" 2>&1)
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|agree|Error" "$OUT/tests.log" | tail -40 ;; esac
case " $STEPS " in *" engine "*)
  wait $SYNTH_PID; tail -2 "$OUT/synth.log"
  (cd /tmp && timeout ${BENCH_TIMEOUT:-240} python3 $REPO/perf/bench_gpu.py --model $MODEL --prompts 512 --gen ${TOKENS:-64} \
    --batches 1,4 $TIER_ARGS ${CAP:+--warm-decode 256} --no-table --json "$OUT/engine.json" 2>&1 | grep -v "^WARNING" | tail -12) ;; esac
case " $STEPS " in *" serve "*)
  wait $SYNTH_PID 2>/dev/null
  for ahead in ${AHEADS:-on}; do  # AHEADS="on off": the same server without the decode pipeline, for comparison
    echo "== serve --decode-ahead $ahead"
    (cd /tmp && exec python3 -m strata serve --model $MODEL --port 8377 --parallel 4 --ctx-size 16384 --cache-ram-mib 4096 \
       --decode-ahead $ahead $TIER_ARGS ${SERVE_ARGS:-} >"$OUT/server_$ahead.log" 2>&1) &
    SERVER_PID=$!
    t0=$(date +%s)
    until curl -sf http://127.0.0.1:8377/health >/dev/null; do
      sleep 1; [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "server not ready in 300 s"; tail -20 "$OUT/server_$ahead.log"; break; }
    done
    echo "server ready after $(( $(date +%s) - t0 )) s"
    (cd /tmp && timeout ${SERVE_TIMEOUT:-300} python3 -m strata bench --url http://127.0.0.1:8377 --pid $SERVER_PID \
      --scenarios ${SCENARIOS:-concurrency,prefill,prefix} --concurrency ${LEVELS:-1,4,16} --tokens ${TOKENS:-64} \
      --long-prompt ${LONG:-4096} ${BENCH_ARGS:-} --json "$OUT/serve_$ahead/bench.json" --out "$OUT/serve_$ahead" 2>&1 | tail -24)
    kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
    grep -E "hit rate|Error|error|Traceback" "$OUT/server_$ahead.log" | tail -6
  done ;; esac
