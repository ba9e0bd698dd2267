# Sourced by the device-machine scripts (run_gpu.sh, run_tiers.sh) from the repo root: installs the carried
# wheels and a copy of Strata into /tmp/site, and points Python and the fixtures at them.
# strata.conf, strata.jit, ... map to top-level folders only when installed (pyproject package-dir), so
# install a copy and run Python from outside the checkout (python -m puts the cwd first on sys.path).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
REPO=$PWD
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 STRATA_FIXTURES=$REPO/.gpu_fixtures
tok=.gpu_fixtures/qwen3_tokenizer/package/models
[ -f $tok/tokenizer.json ] || gunzip -k $tok/tokenizer.json.gz

# Write $MODEL (strata synth: $ARCH, $SHAPE, router skew ${SKEW:-0}, ROUTER_MODE=locality for routing with
# temporal locality, Q4_K experts, Q6_K output; ARCH=qwen4exp
# SHAPE=seeds: perf/synth_qwen4exp.py's seeds preset; PLE_DIM=2048 for a file llama.cpp loads) in the background, or keep the one already there with REUSE=1;
# the log goes to $OUT/synth.log and SYNTH_PID is the job to wait for.
start_synth() {
  (
    if [ -n "${REUSE:-}" ] && [ -f $MODEL ]; then
      echo "reusing $MODEL" >"$OUT/synth.log"
    elif [ "$ARCH" = qwen4exp ]; then
      python3 $REPO/perf/synth_qwen4exp.py --preset $SHAPE ${PLE_DIM:+--ple-dim $PLE_DIM} --output $MODEL \
        >"$OUT/synth.log" 2>&1
      echo "rc=$?" >>"$OUT/synth.log"
    else
      cd /tmp && python3 -m strata synth --arch $ARCH --shape $SHAPE --quant q4_k --output-quant q6_k \
        --router-skew ${SKEW:-0} ${ROUTER_MODE:+--router-mode $ROUTER_MODE} -o $MODEL >"$OUT/synth.log" 2>&1
      echo "rc=$?" >>"$OUT/synth.log"
    fi
  ) &
  SYNTH_PID=$!
}
