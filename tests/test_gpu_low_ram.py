"""The low-RAM mode on the GPU (`--ram-budget-mib`): the pinned arena holds a handful of experts, the rest
are read from the file's mapping, by the CPU share in decode and through the pinned bounce ring in every
longer pass.

Prompt passes (16 rows: past the 8 decode rows, so they stage every miss into borrowed slots, the mapped ones
through the ring) read the very bytes all-resident reads: their logits are bit-identical. Decode gives the
mapped-only misses to the CPU share, whose kernels round differently (tests/test_gpu_share.py says how much),
so decode is held to all-resident with the share's tolerance, and bit for bit to a full-RAM model whose
share takes the same experts, both CPU sides computing the GPU's own int8 arithmetic from each expert's home
address. The counters add up, borrowed slots get their bytes back, and a learning cache policy is refused
(the mapped-only misses are a fixed set of CPU experts, which a policy's swaps would change).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from test_gpu_model import tiny_file
from test_gpu_share import _close, _forced
from test_gpu_tiers import _model, _run

from strata.errors import ConfigError
from strata.gguf import GGUFFile
from strata.tiers.budget import MIB
from strata.tiers.layout import ExpertLayout
from strata.tiers.ram import ring_bytes

pytestmark = pytest.mark.gpu


def _budget(path, experts: int) -> float:
    lay = ExpertLayout.from_gguf(GGUFFile(path))
    return (ring_bytes(lay) + experts * lay.slot_bytes + 1) / MIB


def _home_twin(m) -> None:
    """The CPU side computes the GPU's int8 arithmetic, reading each expert at the cache's home address."""
    from strata.gpu.kernels.mmvq import ref_moe_q8
    from strata.quants import dequantize

    cache, lay = m.expert_cache, m.expert_cache.layout

    def layer(li, h, ids, wts):
        parts = lay.layers[li].parts

        def mat(p):
            def get(e):
                buf = (ctypes.c_uint8 * parts[p].nbytes).from_address(int(cache.home[li, p, e]))
                raw = np.frombuffer(buf, np.uint8).reshape(parts[p].rows, parts[p].row_bytes)
                return dequantize(raw, parts[p].qtype).astype(np.float64)

            return get

        mine = ids >= 0  # the publish gives the CPU's pairs their ids, the GPU's -1
        y = ref_moe_q8(h, np.where(mine, ids, 0), np.where(mine, wts, 0.0), mat(0), mat(1), mat(2))
        return y.astype(np.float32), mine.sum(axis=1).astype(np.int64)

    m.tiers.share.compute = layer


@pytest.mark.parametrize("rows", [3, 0])
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_low_ram_equals_all_resident(tmp_path, arch, rows):
    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(1).integers(0, 900, 32)  # two 16-row chunks: both stage, through the ring
    ref, _ = _run(_model(path), prompt, 6)
    tokens = [int(r[-1].argmax()) for r in ref[:-1]]
    m = _model(path, "50%", ram_budget_mib=_budget(path, rows))
    cache = m.expert_cache
    assert cache.low_ram and int(cache.in_ram.sum()) == rows and m.tiers.ring is not None
    assert cache.borrow_min == 9 and m.tiers.share is not None
    assert cache.cpu[~cache.in_ram & (cache.where < 0)].all(), "every mapped-only miss is the CPU's"
    before = [a.get() for a in m.tiers.slots.arrays]
    got, st = _forced(m, prompt, tokens)
    assert np.array_equal(got[0], ref[0]), "staged prompt passes read the all-resident bytes"
    assert all(np.array_equal(x, a.get()) for x, a in zip(before, m.tiers.slots.arrays)), "borrowed slots"
    worst = max(_close(g, r, f"{arch} low-RAM step {k}") for k, (g, r) in enumerate(zip(got[1:], ref[1:])))
    d, p = st.experts.decode, st.experts.prefill
    per = cache.expert_bytes
    over = d.lookups - d.hits - d.cpu_calls
    assert over * per.min() <= d.pcie_bytes <= over * per.max()
    assert 0 < d.mmap_reads <= d.cpu_calls
    assert per.min() * d.mmap_reads <= d.mmap_bytes <= per.max() * d.mmap_reads
    assert p.mmap_reads > 0 and p.cpu_calls == 0 and p.pcie_bytes > 0
    assert m.tiers.ring.bytes > 0
    print(f"{arch} {rows} arena rows: worst relative L2 {worst:.2e}, prefill {p}, decode {d}")
    m.close()


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_low_ram_equals_full_ram_with_the_same_cpu_share(tmp_path, arch):
    """The low-RAM plumbing (the ring's staged prompt passes, the CPU share reading mapped-only experts at
    their home in the file's mapping) against a full-RAM model, both giving every decode miss to a CPU side
    that computes the GPU's own int8 arithmetic (--pcie-frac 0: the very same pairs, read from the mapping
    in one and the pinned arena in the other): the logits are bit-identical. That the share's plumbing
    matches all-resident to float rounding is test_gpu_share's."""
    path = tiny_file(tmp_path, arch)
    prompt = np.random.default_rng(1).integers(0, 900, 32)
    ref, _ = _run(_model(path), prompt, 6)
    tokens = [int(r[-1].argmax()) for r in ref[:-1]]
    m = _model(path, "50%", ram_budget_mib=_budget(path, 3), pcie_frac=0.0)
    full = _model(path, "50%", pcie_frac=0.0)
    assert m.expert_cache.low_ram and not full.expert_cache.low_ram
    _home_twin(m)
    _home_twin(full)
    got, st = _forced(m, prompt, tokens)
    want, st_full = _forced(full, prompt, tokens)
    for k, (g, w) in enumerate(zip(got, want)):
        rel = float(np.linalg.norm(g - w) / np.linalg.norm(w))
        assert np.array_equal(g, w), f"{arch} step {k}: relative L2 {rel:.3g}"
    assert st.experts.decode.cpu_calls == st_full.experts.decode.cpu_calls > 0
    cache = m.expert_cache  # (the twin reads the mapping itself: the share's mmap counters stay at 0)
    assert (~cache.in_ram & (cache.where < 0)).any(), "some of the CPU's experts are only in the mapping"
    m.close()
    full.close()


def _long(path, cache: str = "auto", **share):
    """A model whose chunks hold a prompt past BORROW_MIN in one pass."""
    from strata.gpu.model import GpuModel, GpuOptions
    from strata.gpu.tiers import TierOptions
    from strata.models import model_class
    from strata.runtime.weights import WeightStore

    g = GGUFFile(path)
    return GpuModel(
        model_class(g)(g, WeightStore(g, 1 << 30)),
        GpuOptions(chunk=512, n_ctx=1024, expert_cache=cache, tiers=TierOptions(pcie_frac=1.0, **share)),
    )


def test_a_long_prompt_and_a_batch_with_low_ram(tmp_path):
    """A 300-row pass (past BORROW_MIN) is exact; so are prompts of 10-12 rows (staged, past the decode rows);
    a batch of three decode rows (the CPU share's) is within the share's tolerance."""
    path = tiny_file(tmp_path, "qwen3moe")
    ids = np.random.default_rng(3).integers(0, 900, 300)
    ref, m = _long(path), _long(path, "50%", ram_budget_mib=_budget(path, 2))
    assert m.expert_cache.low_ram
    assert np.array_equal(
        ref.forward(ids, ref.new_state(), all_logits=False), m.forward(ids, m.new_state(), all_logits=False)
    )
    sr, sm = [ref.new_state() for _ in range(3)], [m.new_state() for _ in range(3)]
    for j in range(3):
        assert np.array_equal(
            ref.forward(ids[: 10 + j], sr[j], all_logits=False),
            m.forward(ids[: 10 + j], sm[j], all_logits=False),
        )
    step = [np.array([t]) for t in (3, 4, 5)]
    for k, (a, b) in enumerate(zip(m.forward_batch(step, sm), ref.forward_batch(step, sr))):
        _close(a, b, f"batched decode row {k}")
    assert sum(s.experts.decode.mmap_reads for s in sm) > 0
    m.close()


def test_a_learning_policy_is_refused_in_low_ram_mode(tmp_path):
    path = tiny_file(tmp_path, "qwen3moe")
    with pytest.raises(ConfigError, match="cache_policy='lru'.*file's mapping.*keeps its fill"):
        _model(path, "50%", ram_budget_mib=_budget(path, 2), cache_policy="lru")


def test_the_gpu_ring_copies_bytes_into_vram():
    from strata.gpu.ring import GpuRing
    from strata.gpu.runtime import cupy_module

    cp = cupy_module()
    src = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    dst = cp.zeros(1 << 20, cp.uint8)
    ring = GpuRing(100_000)  # ten-odd loads, both buffers reused several times
    s0, d0 = int(src.ctypes.data), int(dst.data.ptr)
    rows = np.array([[s0, d0, 600_000], [s0 + 600_000, d0 + 700_000, 300_000]], np.int64)
    ring.copy(rows)
    cp.cuda.get_current_stream().synchronize()
    got = dst.get()
    assert np.array_equal(got[:600_000], src[:600_000])
    assert np.array_equal(got[700_000:1_000_000], src[600_000:900_000])
    assert not got[600_000:700_000].any() and not got[1_000_000:].any() and ring.bytes == 900_000
