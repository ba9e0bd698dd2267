"""The KV cells on the GPU: --kv-resident's window of recent cells in VRAM, the older ones in pinned RAM, and
a KV that grows.

The window only moves cells: prompt logits (chunks that read the cold cells in place, and chunks past
kv.STAGE_ROWS that read a staged copy, through flash's arguments or, for qwen4exp's QSA, the table) and
graph-replayed decode logits must be bit-identical to a model without a window, in fp16 and int8 cells,
through a rollback behind the window's base, and the KV's VRAM stays at the window's size however long the
context. A KV that grows keeps its cells, whether the budget holds the old beside the new or not, and fits
under the pool's limit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_gpu_model import tiny_file

from strata.gguf import GGUFFile
from strata.models import model_class
from strata.runtime.kvcache import KVType
from strata.runtime.weights import WeightStore
from strata.tiers.kvwindow import BLOCK

pytestmark = pytest.mark.gpu


def _model(path: Path, chunk: int, kind: KVType, resident: int = 0):
    from strata.gpu.model import GpuModel, GpuOptions

    g = GGUFFile(path)
    cpu = model_class(g)(g, WeightStore(g, 1 << 30))
    return GpuModel(cpu, GpuOptions(chunk=chunk, n_ctx=1024, kv_type=kind, kv_resident=resident))


def _run(m, prompt: np.ndarray, steps: int, back: int = 0):
    """Each chunk's last logits, greedy decode through the graph; with `back`, a rollback to that many
    positions and the same decode again."""
    st = m.new_state()
    out = []
    for a in range(0, len(prompt), m.chunk):
        out.append(m.forward(prompt[a : a + m.chunk], st, all_logits=False))
    tok = int(out[-1][-1].argmax())
    for _ in range(steps):
        out.append(m.forward(np.array([tok]), st, all_logits=False))
        tok = int(out[-1][-1].argmax())
    if back:
        st.kv.truncate(back)
        st.n_past, st.tokens = back, st.tokens[:back]
        out.append(m.forward(prompt[back : back + 3], st, all_logits=False))
    return out, st


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next", "qwen4exp"])
@pytest.mark.parametrize("kind", [KVType.F16, KVType.INT8])
@pytest.mark.parametrize("chunk", [16, 128], ids=["in-place", "staged"])
def test_a_window_equals_the_whole_kv(tmp_path, arch, kind, chunk):
    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(5).integers(0, 900, 700)
    back = 400 if arch == "qwen3moe" else 0  # DeltaNet state does not roll back
    # qwen4exp: QSA's attend finds the cold cells through the table (a staged layer's rows rewritten)
    ref, _ = _run(_model(path, chunk, kind), prompt, 8, back)
    m = _model(path, chunk, kind, BLOCK)
    got, st = _run(m, prompt, 8, back)
    for k, (a, b) in enumerate(zip(got, ref)):
        assert np.array_equal(a, b), f"{arch} {kind} chunk {chunk}: step {k} differs by {np.abs(a - b).max()}"
    kv = st.kv
    assert kv.cap <= kv.window.device_cells and kv.hcap > 0
    if not back:
        assert kv.base >= 700 - 2 * BLOCK, "the window never gave its cells to the host"
    snap = st.snapshot()  # both sides into one host copy, and back
    again = m.new_state()
    again.restore(snap)
    a_, b_ = st.kv.host(0), again.kv.host(0)
    assert np.array_equal(a_[0], b_[0]) and np.array_equal(a_[1], b_[1])


@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_kv_growth_keeps_the_cells_when_the_budget_holds_one_copy(cp, kind):
    """A KV cache that grows where the budget has no room for the old cells beside the new moves them through
    host RAM; either way the cells survive the move."""
    from strata.gpu.kv import GpuKV
    from strata.runtime.kvcache import KVCache, KVType
    from strata.tiers.budget import Ledger

    kv_kind = KVType(kind)
    per = KVCache.bytes_per_token(kv_kind, 2, 2, 64)
    for budget in (1 << 40, 1000 * per):  # room for both copies, then for the final one only
        kv = GpuKV(Ledger(budget, 0), 2, 2, 64, 4096, kv_kind)
        kv.reserve(300)
        rng = np.random.default_rng(3)
        before = {}
        for name in ["k", "v", "ks", "vs"] if kind == "int8" else ["k", "v"]:
            a = getattr(kv, name)
            a[...] = cp.asarray(rng.integers(-100, 100, a.shape).astype(a.dtype))
            before[name] = a[:, :, :300].get()
        kv.length = 300
        kv.reserve(1000)
        assert kv.cap == 1000 and kv.ledger.used == 1000 * per
        for name, want in before.items():
            np.testing.assert_array_equal(getattr(kv, name)[:, :, :300].get(), want)


@pytest.mark.parametrize("via_host", [False, True])
def test_kv_growth_gives_cached_blocks_back_under_the_pool_limit(cp, via_host):
    """The pool's limit (the budget, strata.gpu.model) counts the blocks cupy caches, and cupy gives them
    back only when cudaMalloc fails: a KV whose new cells would pass the limit gives the cached blocks back
    itself. Through host RAM, the new cells fit under a limit with no room for the old beside them; on the
    device (where the budget holds both), a growth fits beside the cells it moves though the blocks of the
    growth before wait in the pool's cache. The cells survive every move."""
    from strata.gpu import kv as kvmod
    from strata.gpu.kv import GpuKV
    from strata.runtime.kvcache import KVType
    from strata.tiers.budget import Ledger

    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()  # the arrays below are then whole cudaMalloc blocks, none carved from a cached one
    kv = GpuKV(Ledger(1 << 40, 0), 4, 4, 128, 16384, KVType.F16)
    old_hm = kvmod.HOST_MOVE_BYTES
    kvmod.HOST_MOVE_BYTES = 1 if via_host else 1 << 40
    spare = 1 << 20
    try:
        kv.reserve(3000)
        kv.k[...] = 1.5
        kv.v[...] = -2.0
        kv.length = 3000
        per = (kv.k.nbytes + kv.v.nbytes) // 3000
        target = 10000 if via_host else 12000  # the last capacity (on the device: doublings to 6,000, 12,000)
        if via_host:  # room for the new cells alone
            pool.set_limit(size=pool.total_bytes() - 3000 * per + target * per + spare)
        else:  # a growth first, whose old blocks stay cached; then room for the cells and the new beside them
            kv.reserve(5000)
            pool.set_limit(size=pool.used_bytes() + target * per + spare)
        kv.reserve(target)
    finally:
        pool.set_limit(size=0)
        kvmod.HOST_MOVE_BYTES = old_hm
    assert kv.cap == target
    assert float(kv.k[:, :, :3000].min()) == 1.5 and float(kv.v[:, :, :3000].max()) == -2.0
