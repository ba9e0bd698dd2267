#!/bin/bash
# One session on the GPU machine (the device tool's `run`): GPU tests, then the benchmark against
# llama.cpp CUDA on a synthetic Qwen3-30B-A3B-shaped Q4_K file written there. Run from the repo root.
#   perf/run_gpu.sh [tests] [llama] [bench]     (default: all three; output under ${OUT:-/tmp/out})
# ARCH / SHAPE pick another synth file: ARCH=qwen3next SHAPE=80b-a3b (Qwen3-Next-80B-A3B, 42 GiB).
# Strata is measured while llama.cpp builds, then llama.cpp, and one table compares them. Without the llama
# step the 30b-a3b table compares with the published llama.cpp numbers (bench --llama-published);
# BENCH_ARGS adds bench_gpu.py options (e.g. "--prompts 512,4096 --sweep"); TEST_K selects tests (pytest -k).
# Carried in (git-ignored): .whl/ (gguf wheel), .gpu_fixtures/ (tiny qwen3moe Q8_0 fixture, Qwen3
# tokenizer.json.gz for the synth writer), .peer/ (shared/peer/pack-src.sh's llama-src.tgz and
# a copy of shared/peer/build-cuda.sh: ../shared does not travel).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${*:-tests llama bench}
source perf/device_setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/smi.txt"
ARCH=${ARCH:-qwen3moe}; SHAPE=${SHAPE:-30b-a3b}
MODEL=/tmp/$ARCH-$SHAPE-q4_k.gguf
case " $STEPS " in *" bench "*)  # the file (16 GiB at 30b-a3b) is written while the tests run
  (cd /tmp && python3 -m strata synth --arch $ARCH --shape $SHAPE --quant q4_k --output-quant q6_k --router-skew 0 \
     -o $MODEL >"$OUT/synth.log" 2>&1; echo "rc=$?" >>"$OUT/synth.log") &
  SYNTH_PID=$! ;; esac
case " $STEPS " in *" llama "*)  # ~4 min on 16 cores, niced under the tests
  (nice -n 10 bash .peer/build-cuda.sh .peer/llama-src.tgz /tmp/peer >/tmp/peer.log 2>&1 &&
   nice -n 10 ninja -C /tmp/peer/llama.cpp/build llama-batched-bench >>/tmp/peer.log 2>&1; echo "rc=$?" >>/tmp/peer.log) &
  LLAMA_PID=$! ;; esac
case " $STEPS " in *" tests "*)
  (cd /tmp && timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -rA -s -p no:cacheprovider -W "ignore:::cupy" \
    ${TEST_K:+-k "$TEST_K"} $REPO/tests/test_gpu_refs.py $REPO/tests/test_gpu_kernels.py $REPO/tests/test_gpu_deltanet.py $REPO/tests/test_gpu_model.py \
    >"$OUT/tests.log" 2>&1)
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rel |prompt\(|mixed|batch vs|oracle" "$OUT/tests.log" | tail -60 ;; esac
case " $STEPS " in *" bench "*)
  wait $SYNTH_PID; tail -2 "$OUT/synth.log"
  LL=""  # no llama step: the 30b-a3b table compares with the llama.cpp numbers recorded in perf/README.md
  [ "$ARCH-$SHAPE" = qwen3moe-30b-a3b ] && LL="--llama-published"
  # the split-K kernels are new: if their tests failed, benchmark the first versions instead
  if [ -z "${NO_V1_FALLBACK:-}" ] && grep -E "^FAILED" "$OUT/tests.log" 2>/dev/null | grep -qE "split|test_gpu_model"; then
    BENCH_ARGS="${BENCH_ARGS:-} --v1"; fi
  timeout ${BENCH_TIMEOUT:-300} python3 $REPO/perf/bench_gpu.py --model $MODEL ${LLAMA_PID:+--no-table} $LL --profile \
    --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -45
  rc=$?
  if [ -n "${LLAMA_PID:-}" ]; then  # Strata ran while llama.cpp built; now llama.cpp, and the table of both
    wait $LLAMA_PID; tail -3 /tmp/peer.log; tail -20 /tmp/peer.log >"$OUT/peer.log"
    timeout ${LLAMA_TIMEOUT:-300} python3 $REPO/perf/bench_gpu.py --model $MODEL --llama-bin /tmp/peer/llama.cpp/build/bin \
      --strata-json "$OUT/bench.json" --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_llama.log" | tail -12
  fi
  if [ $rc -ne 0 ] && [[ " ${BENCH_ARGS:-} " != *" --v1 "* ]]; then  # Strata side again, first kernel versions
    timeout 150 python3 $REPO/perf/bench_gpu.py --model $MODEL --v1 --json "$OUT/bench_v1.json" 2>&1 | tail -12
  fi ;; esac
