"""--kv-resident on the GPU: the window of recent cells in VRAM, the older ones in pinned RAM.

The window only moves cells: prompt logits (chunks that read the cold cells in place, and chunks past
kv.STAGE_ROWS that read a staged copy, through flash's arguments or, for qwen4exp's QSA, the table) and
graph-replayed decode logits must be bit-identical to a model without a window, in fp16 and int8 cells,
through a rollback behind the window's base, and the KV's VRAM stays at the window's size however long the
context.
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
