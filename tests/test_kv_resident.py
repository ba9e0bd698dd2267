"""--kv-resident N: the window of recent cells on the device, the older ones in host RAM (tiers/kvwindow.py).

The window only moves cells, so what attention reads must be exactly the plain cache's: a KVCache with a
window returns bit-identical keys and values through appends, evictions, rollbacks behind the window's base,
copies and host copies, in every cell type; an engine with --kv-resident gives the same greedy tokens and
logits as one without, on the qwen3moe and qwen3next fixtures with prompts long enough to evict.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine import Engine
from strata.errors import ConfigError
from strata.runtime.kvcache import KVCache, KVType
from strata.sampling.params import SamplingParams
from strata.tiers.kvwindow import BLOCK, KVWindow, check_resident


def _fixture(arch: str):
    from flagship_checks import build
    from oracle import assets, flagship

    return build(assets.tiny_qwen3moe if arch == "qwen3moe" else flagship.tiny_qwen3next)["q8_0"]


def _pass(kv: KVCache, layers: list[int], x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    kv.before_pass(len(x))
    return [kv.append(i, x, -x) for i in layers]


@pytest.mark.parametrize("kind", list(KVType))
def test_a_window_reads_what_the_plain_cache_reads(kind):
    rng = np.random.default_rng(0)
    layers = [0, 3]
    plain, win = (
        KVCache(layers, 2, 32, kind=kind),
        KVCache(layers, 2, 32, kind=kind, window=KVWindow(BLOCK, 300)),
    )
    steps = [300, 300, 1, 1, 250, 7] + [1] * 40 + [300, 1]
    for k, n in enumerate(steps):
        x = rng.standard_normal((n, 2, 32)).astype(np.float32)
        for (a, b), (c, d) in zip(_pass(plain, layers, x), _pass(win, layers, x)):
            assert np.array_equal(a, c) and np.array_equal(b, d), f"step {k}"
        if k == 4:  # roll back behind the window's base: its cells come back from the host
            back = win.base - 10
            assert back > 0
            plain.truncate(back)
            win.truncate(back)
            assert win.base <= back < win.base + win.window.resident + BLOCK
    assert win.base > 0 and win._k[0].cap <= win.window.device_cells
    for copy in (win.copy(), win.to_host().copy()):
        assert copy.window.device_cells == win.window.device_cells and copy.base == win.base
        x = rng.standard_normal((3, 2, 32)).astype(np.float32)
        ref = _pass(plain.copy(), layers, x)
        for (a, b), (c, d) in zip(ref, _pass(copy, layers, x)):
            assert np.array_equal(a, c) and np.array_equal(b, d)
    assert win.nbytes() == plain.nbytes()


def test_the_window_evicts_whole_blocks_and_keeps_room_for_a_pass():
    w = KVWindow(300, 100)  # rounded up to whole blocks
    assert w.resident == 2 * BLOCK and w.device_cells == 3 * BLOCK + 100
    assert w.before_pass(3 * BLOCK - 1, 100) is None  # the last 2 blocks' worth and more: nothing leaves yet
    ev = w.before_pass(3 * BLOCK, 1)
    assert (ev.lo, ev.hi, ev.kept) == (0, BLOCK, 2 * BLOCK) and w.base == BLOCK
    assert w.before_pass(4 * BLOCK - 1, 1) is None
    with pytest.raises(ValueError, match="outgrows"):
        w.before_pass(3 * BLOCK, 101)
    back = w.truncate(BLOCK - 10)
    assert back is not None and (back.lo, back.hi) == (0, BLOCK - 10) and w.base == 0
    for n in range(0, 5 * BLOCK, 37):  # wherever it lands, a window holds the last `resident` cells
        assert 0 <= n - w.base_for(n) < w.resident + BLOCK and (
            n < w.resident or n - w.base_for(n) >= w.resident
        )


def test_bad_windows_are_refused():
    for bad in (-1, BLOCK - 1, 1.5):
        with pytest.raises(ConfigError, match="kv_resident"):
            check_resident(bad, "kv_resident")
    with pytest.raises(ConfigError, match="kv_resident"):
        Engine.load(_fixture("qwen3moe"), device="cpu", backend="numpy", kv_resident=7)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_kv_resident_gives_the_same_tokens(arch):
    path = _fixture(arch)
    ids = [int(v) for v in np.random.default_rng(3).integers(10, 5000, 700)]  # 2 chunks of 512: evicts
    params = SamplingParams(temperature=0.0)
    out = []
    for extra in ({}, {"kv_resident": BLOCK}):
        eng = Engine.load(path, device="cpu", backend="numpy", **extra)
        st = eng.new_state()
        logits = [eng.model.forward(np.asarray(ids[:512]), st, all_logits=False)]
        logits.append(eng.model.forward(np.asarray(ids[512:]), st, all_logits=False))
        gen = eng.generate(ids, max_tokens=8, params=params, ignore_eos=True).run()
        out.append((logits, gen.tokens, st.kv.base))
    (ref, ref_tokens, _), (got, tokens, base) = out
    assert base > 0, "the prompt never left the window"
    assert tokens == ref_tokens
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


def test_the_planner_keeps_only_the_window_in_vram(capsys):
    import json

    from strata.cli import main

    path = _fixture("qwen3moe")
    args = ["--vram-gib", "0.45", "--parallel", "4", "--ctx-size", "1024", "--json"]
    assert main(["plan", str(path), *args]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["plan", str(path), *args, "--kv-resident", str(BLOCK), "--prefill", "64"]) == 0
    win = json.loads(capsys.readouterr().out)
    kv = {k: v for k, v in win["parts"].items() if k.startswith("KV cache")}
    cells = KVWindow(BLOCK, 64 + 64).device_cells  # the window, and room for one pass (the GPU's chunk + 64)
    assert list(kv.values()) == [4 * cells * win["kv_bytes_per_token"]["f16"]]
    assert (
        sum(v for k, v in whole["parts"].items() if k.startswith("KV cache"))
        == 4 * 1024 * (whole["kv_bytes_per_token"]["f16"])
    )
    per = win["kv_bytes_per_token"]["f16"]
    tiers = win["kv_tiers"]
    assert (tiers["vram_cells"], tiers["vram_bytes"]) == (cells, 4 * cells * per)
    assert tiers["ram_bytes"] == 4 * (1024 - cells) * per
    assert tiers["ram_bytes_per_token"] == (1024 - cells) * per  # full attention reads every host cell
    assert 0 < tiers["decode_tok_s_full"] < win["decode_tok_s"]
    assert whole["kv_tiers"]["ram_bytes"] == 0
    assert whole["kv_tiers"]["decode_tok_s_full"] == whole["decode_tok_s"]
    # a long chunk's room for one layer's cells before the window (every layer: per over the layers)
    from gguf import GGUFReader

    n_attn = int(GGUFReader(str(path)).fields["qwen3moe.block_count"].contents())  # every layer attends
    stage = {k: v for k, v in win["parts"].items() if k.startswith("KV staging")}
    assert list(stage.values()) == [tiers["stage_bytes"]]
    assert (1024 - BLOCK) * per // n_attn <= tiers["stage_bytes"] <= (1024 - BLOCK) * per // n_attn + 1024
    assert "KV staging" not in " ".join(whole["parts"]) and whole["kv_tiers"]["stage_bytes"] == 0
    assert main(["plan", str(path), *args, "--kv-resident", "7"]) == 1
    assert "--kv-resident" in capsys.readouterr().err
