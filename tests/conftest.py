"""Session fixtures over the oracle cache (tests/oracle), and GPU-test skipping.

Fixtures build on first use (about a minute on 2 cores with a cold cache) and are free afterwards;
CI runs `python tests/oracle/build_fixtures.py` first. Tests never re-run transformers once built.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from oracle import assets  # noqa: E402
from quant_blocks import MOE_TYPES  # noqa: E402

# Routing profiles (strata/tiers/profile.py) fill later caches from earlier runs: each test session gets its
# own empty cache dir for them, so one test's routing never changes another's placement.
os.environ["STRATA_CACHE_DIR"] = tempfile.mkdtemp(prefix="strata-cache-")


def _build(fn):
    # Builders call transformers/torch, which warn freely; the suite runs with filterwarnings=error,
    # and a warning during a fixture build is not a test failure.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _build(assets.smollm2_gguf)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _build(assets.gemma3_gguf)


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    return _build(assets.qwen3_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen3moe() -> dict[str, Path]:
    return _build(assets.tiny_qwen3moe)


@pytest.fixture(scope="session")
def smollm2_oracle() -> dict:
    return assets.load_npz(_build(assets.smollm2_oracle))


@pytest.fixture(scope="session")
def tokenizer_oracle() -> dict:
    return json.loads(_build(assets.tokenizer_oracle).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def template_oracle() -> dict:
    return json.loads(_build(assets.template_oracle).read_text(encoding="utf-8"))


# ---- the GPU tests' fixtures (their marker skips them where cupy or a GPU is missing) ----


@pytest.fixture(scope="session")
def cp():
    import cupy

    return cupy


@pytest.fixture(scope="module")
def ops(cp):
    """The default kernel generation: for kernels that are the same in every one."""
    from strata.gpu.ops import Ops

    return Ops()


@pytest.fixture(
    scope="module", params=[(True, True), (True, False), (False, False)], ids=["q8", "split", "v1"]
)
def kernel_generations(cp, request):
    """Every kernel generation: int8-input decode products (mmvq, with split-K fp32 kernels for the other
    types), split-K decode on fp32 inputs, and the first versions."""
    from strata.gpu.ops import Ops

    split, q8 = request.param
    return Ops(moe_types=MOE_TYPES, split=split, q8=q8)


def _gpu_available() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cupy

            return bool(cupy.is_available())
    except Exception:  # ImportError, or a CUDA runtime/driver error from cupy
        return False


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _gpu_available():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU through cupy (cupy missing or cupy.is_available() False)"
    )
    for item in gpu_items:
        item.add_marker(skip)
