#!/bin/bash
# The CPU share of the decode misses on the GPU machine (the device tool's `run`), from the repo root:
#   perf/run_share.sh [tests] [share] [bench]   (output under ${OUT:-/tmp/out})
# tests: the share's GPU tests (test_gpu_share.py), then TEST_FILES (default: the int8 products against their
# twins and the share's CPU tests, compiled for the host's own CPU); share: perf/bench_share.py on the 80B
# shape's real-size experts, then the mailbox round trip of the compiled server (THREADS, default 15);
# bench: perf/bench_gpu.py at CAP (default 22528 MiB) on the 80B synth file once per --pcie-frac in
# PCIE_FRACS (default auto,1), then once per value in EFFS with tiers/share.py's CPU_EFFICIENCY (the rate a
# request of more than one row reaches, of the probed one) set to it, to calibrate the table of batch 4.
# PRODUCTS (default int8,float): the share's products, its own int8-input ones (jit/qdot_ir.py) and the
# float kernels alone, for bench_share and for the auto bench, so both are measured on one machine.
# Carried in (git-ignored): .whl/, .gpu_fixtures/ (see run_gpu.sh). Only the JSONs and the tests' and share's
# logs go to OUT (the device returns 8 files a call); the benches' logs stay in /tmp, their lines on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${*:-tests share bench}
PCIE_FRACS=${PCIE_FRACS:-auto,1}
PRODUCTS=${PRODUCTS:-int8,float}
source perf/device_setup.sh
ARCH=${ARCH:-qwen3next}; SHAPE=${SHAPE:-80b-a3b}
MODEL=/tmp/$ARCH-$SHAPE-q4_k.gguf
BENCH="--model $MODEL --vram-budget-mib ${CAP:-22528} --prompts ${PROMPTS:-512} --gen 64 --batches ${BATCHES:-1,4} --no-table"
show() { grep -v "^WARNING" | grep -E "strata|tok/s|CPU share|misses|probe|hit rate|VRAM|Error|error" | tail -${1:-14}; }
case " $STEPS " in *" bench "*) start_synth ;; esac
case " $STEPS " in *" tests "*)
  (cd /tmp && timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -rA -p no:cacheprovider -W "ignore:::cupy" \
    -k "${TEST_K:-not qwen4exp}" $REPO/tests/test_gpu_share.py \
    ${TEST_FILES:-$REPO/tests/test_jit_qdot.py $REPO/tests/test_cpu_share.py} >"$OUT/tests.log" 2>&1)
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error" "$OUT/tests.log" | tail -30 ;; esac
case " $STEPS " in *" bench "*) wait $SYNTH_PID; tail -1 "$OUT/synth.log" ;; esac
case " $STEPS " in *" share "*)
  (cd /tmp && timeout 180 python3 $REPO/perf/bench_share.py --shape 80b --threads ${THREADS:-15} --reps 300 \
      --products $PRODUCTS \
    && timeout 60 python3 $REPO/perf/bench_share.py --serve --threads ${THREADS:-15} --reps 2000) 2>&1 \
    | tee "$OUT/share.log" | grep -v "^WARNING" | tail -12 ;; esac
case " $STEPS " in *" bench "*)
  for f in ${PCIE_FRACS//,/ }; do
    echo "== --pcie-frac $f"
    (cd /tmp && timeout ${BENCH_TIMEOUT:-240} python3 $REPO/perf/bench_gpu.py $BENCH --pcie-frac $f \
      --json "$OUT/bench_$f.json") 2>&1 | tee "/tmp/bench_$f.log" | show
  done
  case ",$PRODUCTS," in *",float,"*)
    echo "== --pcie-frac auto, the float kernels alone"
    (cd /tmp && timeout ${BENCH_TIMEOUT:-240} python3 -c "
import runpy, sys
from strata.jit.kernels import Kernels
Kernels.dot_fn = lambda self, qtype: None
sys.argv = ['bench_gpu.py', *sys.argv[1:]]
runpy.run_path('$REPO/perf/bench_gpu.py', run_name='__main__')" $BENCH --pcie-frac auto \
      --json "$OUT/bench_float.json") 2>&1 | tee /tmp/bench_float.log | show ;; esac
  for e in ${EFFS:-}; do
    echo "== --pcie-frac auto, CPU_EFFICIENCY $e"
    (cd /tmp && timeout ${BENCH_TIMEOUT:-240} python3 -c "
import runpy, sys
import strata.tiers.share as s
s.CPU_EFFICIENCY = float(sys.argv[1])
sys.argv = ['bench_gpu.py', *sys.argv[2:]]
runpy.run_path('$REPO/perf/bench_gpu.py', run_name='__main__')" $e $BENCH --pcie-frac auto \
      --json "$OUT/bench_eff_$e.json") 2>&1 | tee "/tmp/bench_eff_$e.log" | show
  done ;; esac
