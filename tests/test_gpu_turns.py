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


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_a_prompt_read_aside_beside_decode_steps_equals_one_at_a_time(tmp_path, arch):
    """The server's second lane (sched/aside.py): a newcomer's prompt read in passes on the low-priority
    stream by a thread of its own while the engine's thread replays a stream's decode steps on the model's
    stream. Both give, bit for bit, what they give one at a time; a tiered model has no second lane."""
    import threading

    path = tiny_file(tmp_path, arch)
    m = _model(path)
    assert m.aside is not None and _model(path, "50%").aside is None
    rng = np.random.default_rng(11)
    p0, p1 = rng.integers(0, 900, 20), rng.integers(0, 900, 40)
    chunks = [p1[:16], p1[16:32], p1[32:]]
    toks = rng.integers(0, 900, 40)

    def stream_state():
        st = m.new_state()
        m.forward(p0, st, all_logits=False)
        return st

    st = stream_state()
    want_steps = [m.forward(np.array([t]), st, all_logits=False) for t in toks]
    ref1 = m.new_state()
    want_prompt = [m.forward(c, ref1, all_logits=False) for c in chunks]

    st, st1 = stream_state(), m.new_state()
    got_prompt: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got_prompt.extend(m.read_aside(c, st1) for c in chunks))
    reader.start()
    got_steps, beside = [], 0
    for t in toks:
        got_steps.append(m.forward(np.array([t]), st, all_logits=False))
        beside += reader.is_alive()
    reader.join()
    print(
        f"\n{arch}: {beside} of {len(toks)} decode steps ran while the prompt was read aside "
        f"(stream priorities: steps {m.stream.priority}, aside {m.aside.priority})"
    )
    assert m.stream.priority < m.aside.priority  # lower numbers are higher priorities
    assert len(got_prompt) == len(chunks) and st1.n_past == len(p1)
    for a, b in zip(got_prompt, want_prompt):
        assert np.array_equal(a, b), "the prompt read aside differs"
    for a, b in zip(got_steps, want_steps):
        assert np.array_equal(a, b), "a decode step beside the aside read differs"
    # the state read aside goes on in the decode graph as the one read on the model's stream does
    nxt = np.array([5])
    assert np.array_equal(m.forward(nxt, st1, all_logits=False), m.forward(nxt, ref1, all_logits=False))
