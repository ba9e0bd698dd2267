"""Public entry points for test fixtures: `from oracle import assets` (with tests/ on sys.path).

Every function is idempotent: the first call builds into `cache_root()` ($STRATA_FIXTURES, else
~/.cache/strata/fixtures), later calls just return paths. Loading this file by path also works.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The submodules import each other as `oracle.*`, so tests/ must be importable even when this file
# was loaded by path rather than as oracle.assets.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from oracle.fetch import (  # noqa: E402
    FIXTURE_VERSION,
    cache_root,
    gemma3_gguf,
    llama_cpp_src,
    qwen3_tokenizer_dir,
    smollm2_gguf,
)
from oracle.oracles import (  # noqa: E402
    SMOLLM2_GREEDY,
    SMOLLM2_PROMPT,
    TINY_GREEDY,
    TINY_PROMPT,
    TINY_SEED,
    smollm2_oracle,
    template_oracle,
    tiny_qwen3moe,
    tiny_qwen3moe_config,
    tokenizer_oracle,
)

__all__ = [
    "FIXTURE_VERSION",
    "SMOLLM2_GREEDY",
    "SMOLLM2_PROMPT",
    "TINY_GREEDY",
    "TINY_PROMPT",
    "TINY_SEED",
    "build_all",
    "cache_root",
    "gemma3_gguf",
    "llama_cpp_src",
    "load_npz",
    "qwen3_tokenizer_dir",
    "smollm2_gguf",
    "smollm2_oracle",
    "template_oracle",
    "tiny_qwen3moe",
    "tiny_qwen3moe_config",
    "tokenizer_oracle",
]


def load_npz(path) -> dict:
    """An oracle npz as a plain dict of arrays (file closed)."""
    import numpy as np

    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def build_all(log=None, begin=None) -> dict[str, object]:
    """Build every fixture (cheap when cached); `begin(name)` is called before each, `log(name, result,
    seconds)` after."""
    import time

    steps = [
        ("smollm2_gguf", smollm2_gguf),
        ("gemma3_gguf", gemma3_gguf),
        ("qwen3_tokenizer_dir", qwen3_tokenizer_dir),
        ("llama_cpp_src", llama_cpp_src),
        ("tiny_qwen3moe", tiny_qwen3moe),
        ("smollm2_oracle", smollm2_oracle),
        ("tokenizer_oracle", tokenizer_oracle),
        ("template_oracle", template_oracle),
    ]
    out: dict[str, object] = {}
    for name, fn in steps:
        if begin is not None:
            begin(name)
        t0 = time.perf_counter()
        out[name] = fn()
        if log is not None:
            log(name, out[name], time.perf_counter() - t0)
    return out
