"""A conversation's turns on the GPU: a short window (a chat prompt's generation prompt after its checkpoint)
runs as captured decode steps, and the next turn read from a prefix-cache snapshot through the expert tiers
computes what all-resident does."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gpu_fixtures import fixture
from test_gpu_model import VOCAB, _models, rel, tiny_file, write_next
from test_gpu_tiers import _model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", ["qwen3next", "qwen4exp"])
def test_a_window_of_few_rows_runs_as_decode_steps(tmp_path, arch):
    """A window whose sequences bring at most STEP_ROWS rows each (a chat prompt's generation prompt after
    its checkpoint, beside decode rows) runs as captured decode steps, a row of each sequence a step: each
    sequence's last logits are the CPU's, and the states go on as the CPU's do."""
    from strata.runtime.passes import STEP_ROWS

    path = fixture("qwen4exp") if arch == "qwen4exp" else write_next(tmp_path, "tiny", Q.Q8_0)
    cpu, gpu = _models(path, q8=False)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, VOCAB, n) for n in (20, 5, 9)]
    gs, cs = [gpu.new_state() for _ in prompts], [cpu.new_state() for _ in prompts]
    for p, g, c in zip(prompts, gs, cs):
        gpu.forward(p, g, all_logits=False)
        cpu.forward(p, c, all_logits=False)
    steps, step = [], gpu.graphs.step

    def counted(tokens, states):
        steps.append(len(tokens))
        return step(tokens, states)

    gpu.graphs.step = counted
    toks = [rng.integers(0, VOCAB, STEP_ROWS - 3), np.array([4]), rng.integers(0, VOCAB, 3)]
    got, want = gpu.forward_batch(toks, gs), cpu.forward_batch(toks, cs)
    assert steps == [3, 2, 2] + [1] * (STEP_ROWS - 6)  # a row of each sequence that has one left, a step
    errs = [rel(x, y) for x, y in zip(got, want)]
    nxt = [np.array([7])] * 3
    errs += [rel(x, y) for x, y in zip(gpu.forward_batch(nxt, gs), cpu.forward_batch(nxt, cs))]
    print(f"\n{arch} window of decode steps: {', '.join(f'{e:.2e}' for e in errs)}")
    assert max(errs) < 2e-2 and [g.n_past for g in gs] == [c.n_past for c in cs]


@pytest.mark.parametrize("size", ["50%", "off"])
def test_the_next_turn_from_a_snapshot_equals_all_resident(tmp_path, size):
    """The prefix cache's next turn on the GPU: a state read to a checkpoint, copied to host RAM (the server's
    snapshot), decoded on (the answer), then a fresh state restored from the copy reads the next turn's
    prompt in chunks through the tiers. Its logits are the all-resident model's along the same passes, with
    and without the checkpoint's copy in between (a tool loop's second round faulted on an H100 at 24 GiB)."""
    path = tiny_file(tmp_path, "qwen3next")
    rng = np.random.default_rng(7)
    first, rest = rng.integers(0, 900, 30), rng.integers(0, 900, 37)  # the turn: chunks of 16, 16 and 5

    def turn(m, restored: bool):
        st = m.new_state()
        m.forward(first, st, all_logits=False)
        if restored:
            snap = st.snapshot()
            for tok in (5, 6, 7):  # the answer goes on in the old state
                m.forward(np.array([tok]), st, all_logits=False)
            st = m.new_state()
            st.restore(snap)
            st.kv.truncate(len(first))
        out = m.forward(rest, st, all_logits=True)
        return out, [m.forward(np.array([tok]), st, all_logits=False) for tok in (3, 4)]

    want = turn(_model(path), False)
    for restored in (False, True):
        got = turn(_model(path, size), restored)
        assert np.array_equal(got[0], want[0]), f"cache {size}, restored {restored}: the prompt differs"
        for a, b in zip(got[1], want[1]):
            assert np.array_equal(a, b), f"cache {size}, restored {restored}: decode after it differs"
