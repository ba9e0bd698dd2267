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
