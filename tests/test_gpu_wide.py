"""A lone prompt's wide passes under tiers on the GPU (strata.gpu.wide): the same logits, counters and slots
as chunk passes, and a hybrid prompt's checkpoints taken inside the pass as chunk passes would have them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_gpu_model import tiny_file
from test_gpu_tiers import _changed_slots, _model

from strata.gguf import GGUFFile
from strata.tiers.layout import ExpertLayout

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_wide_prompt_pass_equals_chunked_passes(tmp_path, arch):
    """A lone prompt under tiers reads in one wide pass (GpuModel.prompt_rows: every layer over chunk-sized
    parts, each part's rows attending to the cells the parts before it wrote, the recurrent state carried
    from part to part), and computes what chunk passes compute, bit for bit: the prompt's last logits and the
    greedy decode after it. Each part's counts and routed ids land at its own rows (the same lookups and
    hits), the layer's misses are staged once for every part (fewer bytes over PCIe), and the borrowed slots
    get their own experts back."""
    import cupy

    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(7).integers(0, 900, 100)  # 16-row parts: six of 16, a rest of 4

    def run(chunked: bool):  # type: ignore[no-untyped-def]
        m = _model(path, "50%")
        m.expert_cache.borrow_min = 12  # the 16-row parts stage their misses
        assert m.prompt_rows == 256  # the context's length: the whole prompt in one pass
        if chunked:
            m.prompt_rows = m.chunk
        cupy.cuda.Device().synchronize()
        before = [a.get() for a in m.tiers.slots.arrays]
        st = m.new_state()
        out = [m.forward(prompt, st, all_logits=False)]
        for _ in range(4):
            out.append(m.forward(np.array([int(out[-1][-1].argmax())]), st, all_logits=False))
        return out, st.experts, _changed_slots(m, before)

    (wide, use, changed), (ref, use_ref, _) = run(False), run(True)
    for k, (a, b) in enumerate(zip(wide, ref)):
        assert np.array_equal(a, b), f"{arch}: step {k} differs by {np.abs(a - b).max()}"
    assert not changed, f"{arch}: changed slots (part, slot, its expert): {changed}"
    assert (use.prefill.lookups, use.prefill.hits) == (use_ref.prefill.lookups, use_ref.prefill.hits)
    assert use.prefill.lookups == len(prompt) * _lookups_a_row(path) and use.decode == use_ref.decode
    assert 0 < use.prefill.pcie_bytes < use_ref.prefill.pcie_bytes


def test_a_wide_pass_keeps_the_recurrent_state_at_its_marks(tmp_path):
    """A hybrid prompt's wide pass takes its prefix-cache checkpoints inside it (GpuModel.forward_marked): the
    recurrent state each mark's part left, copied to host RAM as the pass runs, is the state chunk passes
    have at that position, bit for bit; a snapshot at the mark (with the KV's cells before it), restored,
    reads the rest of the prompt to the same logits; and the pass's own logits are the chunk passes'."""
    from strata.gpu.deltanet import RECURRENT

    path = tiny_file(tmp_path, "qwen3next")
    prompt = np.random.default_rng(8).integers(0, 900, 100)
    marks = [32, 64]  # chunk boundaries: the wide pass's parts are the chunk passes'
    m = _model(path, "50%")
    m.expert_cache.borrow_min = 12
    st = m.new_state()
    wide, kept = m.forward_marked(prompt, st, marks)
    m.prompt_rows, ref, states = m.chunk, m.new_state(), []
    for s, e in zip([0, *marks], [*marks, len(prompt)]):
        last = m.forward(prompt[s:e], ref, all_logits=False)
        rec = ref.layers[RECURRENT]
        states.append((rec.conv.get(), rec.ssm.get()))
    assert np.array_equal(wide, last[-1]), f"the pass's logits differ by {np.abs(wide - last[-1]).max()}"
    assert [k.n_past for k in kept] == marks
    for k, (conv, ssm) in zip(kept, states):
        host = k.layers[RECURRENT]
        assert np.array_equal(host.conv, conv) and np.array_equal(host.ssm, ssm), f"state at {k.n_past}"
    again = m.new_state()
    again.restore(st.snapshot(kept[1]))
    assert again.n_past == 64 and again.tokens == [int(t) for t in prompt[:64]]
    out = m.forward(prompt[64:], again, all_logits=False)
    assert np.array_equal(out[-1], last[-1]), f"restored at 64: differs by {np.abs(out[-1] - last[-1]).max()}"


def _lookups_a_row(path: Path) -> int:
    """Routed lookups a row makes over every MoE layer of the file at `path`."""
    layout = ExpertLayout.from_gguf(GGUFFile(path))
    return len(layout.layers) * layout.top_k
