#!/bin/bash
# Nsight Compute on the prefill GEMMs of one pp512 pass (the device tool's `run`, carry .whl .gpu_fixtures):
# one layer's five qgemm launches (q|k|v, o, gate, up, down) after layer 0, with occupancy, warp-state and
# memory sections; the whole report lands in $OUT/ncu.txt. Run from the repo root.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 STRATA_FIXTURES=$PWD/.gpu_fixtures
tok=.gpu_fixtures/qwen3_tokenizer/package/models; [ -f $tok/tokenizer.json ] || gunzip -k $tok/tokenizer.json.gz
S=$PWD/perf/ncu_pp512.py
cd /tmp && python3 -m strata synth --arch qwen3moe --shape 30b-a3b --quant q4_k --output-quant q6_k --router-skew 0 -o /tmp/m.gguf >/dev/null 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu=$NCU"
# launches per layer at pp512: qkv, o, gate, up (qgemm<12,0,64>), down (qgemm<12,1,64>); skip layer 0
timeout 240 $NCU --clock-control none --target-processes all -k regex:qgemm --launch-skip 5 --launch-count 5 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
  python3 $S /tmp/m.gguf > $OUT/ncu.txt 2>&1; echo "ncu rc=$?"
grep -E "qgemm|Duration|Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers|Stall|Block Limit|Theoretical Occ|Grid Size|One or More|No Eligible|Issued Warp" $OUT/ncu.txt | head -120
